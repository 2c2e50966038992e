"""Model-server processes the agent launches: a real process, real HTTP, stopped on request, and its
GPU memory counted as managed (NVML replaced only at the pynvml boundary)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from agent.accelerator import read_gpus
from agent.processes import FAILED, RUNNING, STOPPED, ProcessManager
from tests.agent.fakes import FakeGpu, fake_pynvml

GIB = 2**30
ECHO = {
    "command": "{python}",
    "args": ["-m", "agent.engines.echo", "--port", "{port}", "--model", "{model}"],
    "health_path": "/health",
    "values": {"model": "tiny"},
    "model": "tiny",
}


def wait_for(predicate, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_launched_server_runs_answers_is_managed_and_stops(tmp_path: Path):
    manager = ProcessManager(tmp_path)
    server = manager.launch({**ECHO, "server_id": "s1"})
    try:
        assert wait_for(lambda: server.state == RUNNING), list(server.output)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/models", timeout=5) as response:
            assert json.loads(response.read())["data"][0]["id"] == "tiny"
        assert manager.launch({**ECHO, "server_id": "s1"}) is server  # a retried launch starts nothing new
        assert manager.pids() == {server.process.pid}

        # NVML sees this process and another one on the GPU: only ours is ModelForge's.
        nvml = fake_pynvml(
            [
                FakeGpu(
                    total=48 * GIB,
                    used=20 * GIB,
                    compute=[(server.process.pid, 6 * GIB), (999_999, 14 * GIB)],
                )
            ]
        )
        (reading,) = read_gpus(nvml, manager.pids())
        assert reading.memory_managed_bytes == 6 * GIB
        assert reading.external_pressure_bytes == 14 * GIB
    finally:
        stopped = manager.stop("s1")
    assert stopped is not None and stopped.state == STOPPED
    assert server.process.poll() is not None
    assert manager.pids() == frozenset()


def test_a_server_that_exits_before_it_is_healthy_is_failed_with_its_output(tmp_path: Path):
    manager = ProcessManager(tmp_path)
    spec = {
        **ECHO,
        "server_id": "bad",
        "args": ["-c", "print('no such engine'); raise SystemExit(4)", "{port}"],
    }
    server = manager.launch(spec)
    assert wait_for(lambda: server.state == FAILED)
    assert "exited with status 4 before it was healthy" in server.reason
    assert "no such engine" in server.reason


def test_an_engines_child_processes_count_as_managed(tmp_path: Path):
    # vLLM and others spawn workers: their GPU memory is ModelForge's too, not external pressure.
    manager = ProcessManager(tmp_path)
    spec = {
        **ECHO,
        "server_id": "family",
        "command": "/bin/sh",
        "args": ["-c", "sleep 30 & exec {python} -m agent.engines.echo --port {port}"],
    }
    server = manager.launch(spec)
    try:
        assert wait_for(lambda: server.state == RUNNING), list(server.output)
        assert wait_for(lambda: len(manager.pids()) >= 2)
        assert server.process.pid in manager.pids()
    finally:
        manager.stop("family")
    assert wait_for(lambda: manager.pids() == frozenset())


def test_servers_left_running_by_a_crashed_agent_are_adopted_by_its_next_run(tmp_path: Path):
    """An agent killed with SIGKILL leaves its servers running (their own sessions): the next run adopts
    them from the state volume, reports them running with the same pid and port, and can stop them."""
    state = tmp_path / "servers.json"
    first = ProcessManager(tmp_path, state_file=state)
    server = first.launch({**ECHO, "server_id": "s9", "meta": {"name": "echo-9", "profile": "test-echo"}})
    assert wait_for(lambda: server.state == RUNNING), list(server.output)
    pid, port = server.process.pid, server.port
    # The first run dies without stopping anything (nothing of it runs any more).
    second = ProcessManager(tmp_path, state_file=state)
    assert second.adopt() == ["s9"]
    adopted = second.get("s9")
    assert adopted is not None
    assert wait_for(lambda: adopted.state == RUNNING)
    payload = adopted.as_payload()
    assert (payload["pid"], payload["port"], payload["meta"]["name"]) == (pid, port, "echo-9")
    assert second.pids() >= {pid}
    second.stop("s9")
    assert wait_for(lambda: adopted.process.poll() is not None)
    assert server.process.wait(5) is not None  # really gone (reaped by us, its real parent, here)
    assert json.loads(state.read_text()) == []
    # A third run finds nothing to adopt: the list says what runs, not what once ran.
    assert ProcessManager(tmp_path, state_file=state).adopt() == []


def test_an_entry_whose_process_is_gone_or_is_another_process_now_is_not_adopted(tmp_path: Path):
    import os

    state = tmp_path / "servers.json"
    own = os.getpid()
    state.write_text(
        json.dumps(
            [
                {"server_id": "gone", "pid": 2**22 - 3, "ticks": 1, "port": 1},
                {"server_id": "reused", "pid": own, "ticks": 1, "port": 1},  # a pid now someone else's
                {"server_id": "garbage"},
            ]
        )
    )
    assert ProcessManager(tmp_path, state_file=state).adopt() == []


# An engine whose health answers at once, and whose first inference crashes the process (as llama.cpp
# built for another CPU dies with SIGILL) or fails: never reported running.
FRAGILE_ENGINE = """
import http.server, json, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def do_POST(self):
        if sys.argv[2] == "crash":
            os._exit(132)
        self.send_response(500); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_server_is_running_only_once_a_one_token_inference_answers(tmp_path: Path):
    manager = ProcessManager(tmp_path)
    ready = manager.launch({**ECHO, "server_id": "ok", "ready_check": "chat"})
    crashing = manager.launch(
        {
            **ECHO,
            "server_id": "sigill",
            "ready_check": "chat",
            "args": ["-c", FRAGILE_ENGINE, "{port}", "crash"],
        }
    )
    try:
        assert wait_for(lambda: ready.state == RUNNING), list(ready.output)
        assert wait_for(lambda: crashing.state == FAILED)
        assert "exited with status 132 before it was ready (its first inference)" in crashing.reason
        # Without a ready check the same engine is reported running on its health alone.
        naive = manager.launch(
            {**ECHO, "server_id": "naive", "args": ["-c", FRAGILE_ENGINE, "{port}", "crash"]}
        )
        assert wait_for(lambda: naive.state == RUNNING)
    finally:
        manager.stop_all()


def test_a_server_whose_inference_keeps_failing_fails_at_the_limit_naming_it(tmp_path: Path):
    manager = ProcessManager(tmp_path)
    manager.start_timeout_s = 2
    failing = manager.launch(
        {**ECHO, "server_id": "e500", "ready_check": "chat", "args": ["-c", FRAGILE_ENGINE, "{port}", "500"]}
    )
    try:
        assert wait_for(lambda: failing.state == FAILED)
        assert failing.reason == "healthy, but a one-token chat request answered HTTP 500 within 2 s"
    finally:
        manager.stop_all()
