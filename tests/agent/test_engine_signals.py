"""Engine signals on the agent: llama.cpp's and vLLM's metrics text parsed, read over real HTTP from real
engines at heartbeat time, never delaying a heartbeat, and an engine without metrics asked again rarely
and quietly."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.engine_signals import EngineSignalReader, parse_samples, reading_from
from agent.processes import RUNNING, ProcessManager
from agent.protocol import signed_headers
from tests.agent.support import CLUSTER_SECRET, RecordingControlPlane, run_agent
from tests.agent.test_processes import ECHO, wait_for

# As llama-server --metrics publishes them (tools/server: counters, then gauges; builds since mid-2025
# have no kv_cache_usage_ratio, older ones had it and kv_cache_tokens).
LLAMACPP_CURRENT = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1.85
"""
LLAMACPP_OLDER = LLAMACPP_CURRENT + (
    "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
    "llamacpp:kv_cache_usage_ratio 0.375\n"
)
# vLLM V1: one series per engine core (data parallel), labelled; the label values may hold anything.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/models/a} b \\"q\\""} 3.0
vllm:num_requests_running{engine="1",model_name="/models/a} b \\"q\\""} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0 1764560000000
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.625
vllm:num_requests_running_total_not_this 99
"""
VLLM_V0 = """\
vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
"""


def test_llamacpp_current_builds_report_running_and_waiting_without_a_kv_share():
    reading = reading_from(LLAMACPP_CURRENT, "llamacpp", 10.0)
    assert reading is not None
    assert reading.as_payload() == {"running": 2, "waiting": 5, "kv_cache_used": None, "at": 10.0}


def test_llamacpp_older_builds_also_report_their_kv_share():
    reading = reading_from(LLAMACPP_OLDER, "llamacpp", 10.0)
    assert reading is not None and (reading.running, reading.waiting, reading.kv_cache_used) == (2, 5, 0.375)


def test_vllm_sums_its_engine_cores_and_reports_the_fullest_kv_cache():
    reading = reading_from(VLLM, "vllm", 10.0)
    assert reading is not None
    assert (reading.running, reading.waiting, reading.kv_cache_used) == (7, 1, 0.625)


def test_vllm_before_v1_reports_under_its_older_kv_name():
    reading = reading_from(VLLM_V0, "vllm", 1.0)
    assert reading is not None and (reading.running, reading.waiting, reading.kv_cache_used) == (1, 2, 0.5)


def test_an_engine_not_named_is_read_in_whichever_dialect_its_text_has():
    assert reading_from(VLLM_V0, "", 1.0) is not None
    assert reading_from(LLAMACPP_CURRENT, "", 1.0) is not None
    # Named, the engine's own dialect only: llama.cpp text is not vLLM's.
    assert reading_from(LLAMACPP_CURRENT, "vllm", 1.0) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "llamacpp:requests_processing 1\n",  # no waiting figure
        "llamacpp:requests_processing NaN\nllamacpp:requests_deferred 0\n",
        "llamacpp:requests_processing -3\nllamacpp:requests_deferred 0\n",
        "llamacpp:requests_processing{broken 1\nllamacpp:requests_deferred 0\n",
        "<html>Not Found</html>",
    ],
)
def test_text_without_usable_running_and_waiting_figures_is_no_reading(text: str):
    assert reading_from(text, "llamacpp", 1.0) is None


def test_a_kv_share_outside_0_to_1_is_left_out_not_reported_wrong():
    text = (
        "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\nllamacpp:kv_cache_usage_ratio 37.5\n"
    )
    reading = reading_from(text, "llamacpp", 1.0)
    assert reading is not None and reading.kv_cache_used is None


def test_the_parser_keeps_only_the_wanted_names_and_every_labelled_series():
    samples = parse_samples(VLLM, {"vllm:num_requests_running", "vllm:num_requests_waiting"})
    assert samples == {"vllm:num_requests_running": [3.0, 4.0], "vllm:num_requests_waiting": [1.0, 0.0]}


# --- real HTTP -------------------------------------------------------------------------------------------

# The reads' deadline in the tests that are not about it: a loaded test machine may take longer than the
# agent's 250 ms to schedule a thread, which is not what they test.
SLACK_S = 3.0


@dataclass
class Engine:
    """A metrics endpoint on a real socket: answers ``text`` with ``status`` after ``delay_s``."""

    text: str = LLAMACPP_OLDER
    status: int = 200
    delay_s: float = 0.0
    hits: int = 0
    port: int = 0
    server: Any = field(default=None, repr=False)


@pytest.fixture
def engines() -> Iterator[Any]:
    started: list[Engine] = []

    def start(**options: Any) -> Engine:
        engine = Engine(**options)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine.hits += 1
                time.sleep(engine.delay_s)
                body = engine.text.encode()
                self.send_response(engine.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        engine.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        engine.server.daemon_threads = True
        engine.port = engine.server.server_address[1]
        threading.Thread(
            target=engine.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.server.shutdown()
        engine.server.server_close()


@dataclass
class Managed:
    """The three things the reader needs of agent.processes.ManagedServer."""

    server_id: str
    port: int
    state: str = RUNNING
    meta: dict[str, Any] = field(default_factory=lambda: {"engine": "llamacpp"})


def test_each_running_server_is_reported_with_its_engines_figures(engines):
    llama, vllm = engines(), engines(text=VLLM)
    reader = EngineSignalReader(timeout_s=SLACK_S, clock=lambda: 1234.5)
    try:
        entries = reader.read(
            [
                Managed("a", llama.port),
                Managed("b", vllm.port, meta={"engine": "vllm"}),
                Managed("c", llama.port, state="starting"),  # not asked until it runs
            ]
        )
    finally:
        reader.close()
    assert entries == [
        {"server_id": "a", "engine": {"running": 2, "waiting": 5, "kv_cache_used": 0.375, "at": 1234.5}},
        {"server_id": "b", "engine": {"running": 7, "waiting": 1, "kv_cache_used": 0.625, "at": 1234.5}},
    ]
    assert llama.hits == 1


def test_a_hung_engine_never_delays_the_heartbeat_nor_hides_the_others(engines):
    hung, fine = engines(delay_s=5), engines()
    reader = EngineSignalReader(timeout_s=0.5)
    try:
        started = time.monotonic()
        entries = reader.read([Managed("hung", hung.port), Managed("fine", fine.port)])
        took = time.monotonic() - started
        # Asked again next time: slow is not "has no metrics".
        reader.read([Managed("hung", hung.port)])
    finally:
        reader.close()
    assert [entry["server_id"] for entry in entries] == ["fine"]
    assert took < 1.5, took  # the deadline and a little: never the engine's 5 s
    assert hung.hits == 2


@pytest.mark.parametrize(
    "options", [{"status": 404, "text": "Not Found"}, {"status": 501}, {"text": "# nothing of ours\nx 1\n"}]
)
def test_an_engine_without_metrics_is_asked_again_only_after_the_retry_time_and_quietly(
    engines, options, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="agent")
    caplog.set_level(logging.WARNING, logger="httpx")  # as the agent runs (agent/__main__.py)
    engine = engines(**options)
    reader = EngineSignalReader(timeout_s=SLACK_S, retry_s=0.5)
    try:
        readings = [reader.read([Managed("s", engine.port)]) for _ in range(5)]
        assert engine.hits == 1
        time.sleep(0.6)
        readings.append(reader.read([Managed("s", engine.port)]))
    finally:
        reader.close()
    assert readings == [[]] * 6
    assert engine.hits == 2
    assert caplog.text == ""


def test_an_engine_that_is_gone_reports_nothing_and_logs_nothing_above_debug(caplog):
    caplog.set_level(logging.INFO, logger="agent")
    caplog.set_level(logging.WARNING, logger="httpx")  # as the agent runs (agent/__main__.py)
    reader = EngineSignalReader()
    try:
        probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
        port = probe.server_address[1]
        probe.server_close()  # nothing listens there now
        assert reader.read([Managed("gone", port)]) == []
    finally:
        reader.close()
    assert caplog.text == ""


@pytest.mark.parametrize(("dialect", "kv"), [("llamacpp", None), ("vllm", 0.01)])
def test_the_echo_engine_with_metrics_reports_the_requests_it_is_answering(tmp_path: Path, dialect, kv):
    """The agent's own test engine, launched as a model server: a streamed chat in flight is running."""
    manager = ProcessManager(tmp_path)
    spec = {
        **ECHO,
        "server_id": "echo-1",
        "args": [*ECHO["args"], "--metrics", dialect],
        "meta": {"engine": dialect},
    }
    server = manager.launch(spec)
    reader = EngineSignalReader(timeout_s=SLACK_S)
    try:
        assert wait_for(lambda: server.state == RUNNING), list(server.output)
        assert reader.read(manager.all())[0]["engine"]["running"] == 0
        body = json.dumps(
            {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "a b c d e f"}]}
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        streaming = threading.Thread(target=lambda: urllib.request.urlopen(request, timeout=10).read())
        streaming.start()
        assert wait_for(lambda: reader.read(manager.all())[0]["engine"]["running"] == 1, 5)
        entry = reader.read(manager.all())[0]
        assert entry["server_id"] == "echo-1"
        assert entry["engine"]["waiting"] == 0 and entry["engine"]["kv_cache_used"] == kv
        streaming.join()
    finally:
        reader.close()
        manager.stop("echo-1")


def test_the_echo_engine_without_metrics_has_none(tmp_path: Path):
    manager = ProcessManager(tmp_path)
    server = manager.launch({**ECHO, "server_id": "plain", "meta": {"engine": "test"}})
    reader = EngineSignalReader(timeout_s=SLACK_S)
    try:
        assert wait_for(lambda: server.state == RUNNING), list(server.output)
        assert reader.read(manager.all()) == []
    finally:
        reader.close()
        manager.stop("plain")


def test_the_running_agent_reports_its_servers_engine_signals_with_its_heartbeats(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, tmp_path: Path
):
    """The whole agent: a server launched through its signed port, then heartbeats carrying its figures.
    Before the launch, and for a server whose engine has none, the body has no ``servers`` at all."""
    port = int(agent_env["MODELFORGE_AGENT_PORT"])
    models = tmp_path / "state" / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / "tiny.gguf").write_bytes(b"GGUF")  # the launch checks the model is on the node
    launched: list[int] = []

    def launch(server_id: str, metrics: list[str]) -> None:
        spec = {
            **ECHO,
            "server_id": server_id,
            "model": "tiny.gguf",
            "args": [*ECHO["args"], *metrics],
            "meta": {"engine": "llamacpp" if metrics else "test"},
        }
        body = json.dumps(spec).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/servers",
            data=body,
            headers={
                "Content-Type": "application/json",
                **signed_headers(CLUSTER_SECRET, "POST", "/v1/servers", body),
            },
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            launched.append(response.status)

    def reported() -> bool:
        beats = control_plane.heartbeats
        if beats and not launched:
            launch("with-metrics", ["--metrics", "llamacpp"])
            launch("without", [])
        return any("servers" in beat.json() for beat in beats)

    assert run_agent(agent_env, reported, timeout=30) == 0
    assert launched == [200, 200]
    bodies = [beat.json() for beat in control_plane.heartbeats]
    assert "servers" not in bodies[0]
    (entry,) = next(body["servers"] for body in bodies if "servers" in body)
    assert entry["server_id"] == "with-metrics"
    assert {k: entry["engine"][k] for k in ("running", "waiting", "kv_cache_used")} == {
        "running": 0,
        "waiting": 0,
        "kv_cache_used": None,
    }
    assert abs(entry["engine"]["at"] - time.time()) < 30
