"""Admission over real HTTP (issue 18, item 3): a runtime profile's ``max_concurrent`` holds a backend to
that many requests at once, the rest wait at the gateway and are served in turn across credentials, a
full queue and a passed deadline are ``503`` with a named code and ``Retry-After``, a client that leaves
while waiting leaves the queue, and the queue depth is on /metrics and the dashboard.

A web process of its own (gunicorn, real echo engines, the test PostgreSQL and Redis) reads a copy of
config/ with two limited profiles, and waits at most 4 requests for at most 4 s. The echo engine streams a
word every 0.2 s: a stream of n words holds its slot for about 0.2 x n s."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import User

from apps.clusters.models import Capability
from apps.clusters.tests.factories import bind, credential, echo_backend, loopback_node
from apps.servers.models import ModelServer
from tests.fixtures import (
    LiveWeb,
    start_web,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

ROOT = Path(__file__).resolve().parents[3]
DEADLINE_S = 4
MAX_WAITING = 4
LIMITED = """
name = "{name}"
engine = "test"
accelerator = "cpu"
endpoints = ["chat", "embeddings"]
max_concurrent = {limit}

[memory]
rule = "fixed"
per_gpu_gib = 0.25

[launch]
command = "{{python}}"
args = ["-m", "agent.engines.echo", "--port", "{{port}}", "--model", "{{model}}"]
"""


@pytest.fixture(scope="module")
def limited_web(django_db_setup, tmp_path_factory) -> Iterator[LiveWeb]:
    """A gateway whose config has ``test-echo-one`` (max_concurrent 1) and ``test-echo-two`` (2)."""
    home = tmp_path_factory.mktemp("admission")
    config = home / "config"
    shutil.copytree(ROOT / "config", config)
    for name, limit in (("test-echo-one", 1), ("test-echo-two", 2)):
        (config / "runtimes" / f"{name}.toml").write_text(LIMITED.format(name=name, limit=limit))
    web = start_web(
        home / "web.log",
        MODELFORGE_LOG_LEVEL="INFO",
        MODELFORGE_CONFIG_DIR=str(config),
        MODELFORGE_GATEWAY_QUEUE_MAX_WAITING=str(MAX_WAITING),
        MODELFORGE_GATEWAY_QUEUE_DEADLINE_S=str(DEADLINE_S),
        MODELFORGE_HEARTBEAT_INTERVAL="1",
    )
    yield web
    web.process.stop()


@pytest.fixture
def served(limited_web, tmp_path) -> Iterator[dict[str, str]]:
    """``chat.one@1`` on a server limited to 1 and ``chat.two@1`` on one limited to 2; the keys of three
    credentials scoped to both."""
    node = loopback_node()
    processes = []
    for limit in ("one", "two"):
        process, port = echo_backend(tmp_path, f"echo-{limit}")
        processes.append(process)
        server = ModelServer.objects.create(
            name=f"echo-{limit}",
            profile=f"test-echo-{limit}",
            model=limit,
            node=node,
            port=port,
            state="running",
        )
        bind(f"chat.{limit}@1", server=server)
    keys = {who: credential(["chat.one@1", "chat.two@1"]) for who in ("a", "b", "c")}
    # The gateway's table has them once it serves them (the change notice, within a second).
    assert wait_until(lambda: chat(limited_web.url, keys["c"], "chat.two@1", "x").status_code == 200, 15)
    assert chat(limited_web.url, keys["c"], "chat.one@1", "x").status_code == 200
    yield keys
    for process in processes:
        os.killpg(process.process.pid, signal.SIGTERM)
        process.process.wait(10)


def chat(
    url: str, key: str, model: str, text: str, stream: bool = False, timeout: float = 20
) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": text}], "stream": stream},
        headers={"Authorization": f"Bearer {key}"},
        timeout=timeout,
    )


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def timed_stream(url: str, key: str, model: str, text: str, began: float) -> tuple[int, float, float]:
    """(status, first byte, end) of a streamed chat, in seconds from ``began``."""
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": text}], "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=20,
    ) as response:
        first = None
        for _ in response.iter_raw():
            first = first or time.monotonic() - began
        return response.status_code, first or 0.0, time.monotonic() - began


def depth(operator_client, capability: str) -> float | None:
    scraped = operator_client.get("/metrics").content.decode()
    found = re.search(
        rf'^modelforge_gateway_queue_depth\{{capability="{re.escape(capability)}"\}} (\S+)$', scraped, re.M
    )
    return float(found.group(1)) if found else None


def refusals(operator_client, capability: str, code: str) -> float | None:
    """``modelforge_gateway_queue_refusals_total`` of ``capability`` and ``code``, as /metrics has it."""
    scraped = operator_client.get("/metrics").content.decode()
    found = re.search(
        rf'^modelforge_gateway_queue_refusals_total\{{capability="{re.escape(capability)}",code="{code}"\}} '
        r"(\S+)$",
        scraped,
        re.M,
    )
    return float(found.group(1)) if found else None


def test_a_backend_limited_to_two_serves_two_at_once_and_the_rest_wait_and_succeed(limited_web, served):
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=5) as pool:
        # Five streams of 5 words (about 1 s each) on a backend that takes 2 at once: three waves.
        results = list(
            pool.map(
                lambda who: timed_stream(limited_web.url, served[who], "chat.two@1", words(5), began),
                ["a", "b", "c", "a", "b"],
            )
        )
    assert [status for status, _, _ in results] == [200] * 5
    starts = sorted(first for _, first, _ in results)
    # Two start at once; the third only when one of them has ended (about 1 s later), the fifth likewise.
    assert starts[1] < 0.9, starts
    assert starts[2] - starts[0] >= 0.9 and starts[4] - starts[2] >= 0.9, starts


def test_past_the_deadline_a_waiting_request_is_refused_with_a_named_code(
    limited_web, served, operator_client, client
):
    timeouts = refusals(operator_client, "chat.one@1", "QUEUE_TIMEOUT")
    assert timeouts is not None  # every capability has the series, before any refusal
    assert refusals(operator_client, "chat.two@1", "QUEUE_FULL") is not None
    holder = threading.Thread(target=chat, args=(limited_web.url, served["a"], "chat.one@1", words(30), True))
    holder.start()  # holds the one slot for about 6 s
    time.sleep(0.3)
    answers: list[httpx.Response] = []
    began = time.monotonic()
    waiting = threading.Thread(
        target=lambda: answers.append(chat(limited_web.url, served["b"], "chat.one@1", "x"))
    )
    waiting.start()
    # While it waits: the queue depth on /metrics and on the dashboard (capabilities, "Waiting").
    assert wait_until(lambda: depth(operator_client, "chat.one@1") == 1, 3)
    assert depth(operator_client, "chat.two@1") == 0
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/clusters/").content.decode()
    pk = Capability.objects.get(name="chat.one@1").pk
    assert re.search(rf'id="waiting-{pk}"><span class="badge badge-warning">1 waiting</span>', page), page
    waiting.join(15)
    elapsed = time.monotonic() - began
    refused = answers[0]
    assert refused.status_code == 503 and refused.json()["code"] == "QUEUE_TIMEOUT", refused.text
    assert refused.headers["retry-after"] == "5"
    assert "MODELFORGE_GATEWAY_QUEUE_DEADLINE_S" in refused.json()["message"]
    assert DEADLINE_S - 0.2 <= elapsed <= DEADLINE_S + 1.5, elapsed
    # Counted on /metrics once the web process has flushed (within a second).
    assert wait_until(lambda: refusals(operator_client, "chat.one@1", "QUEUE_TIMEOUT") == timeouts + 1, 3)
    holder.join(15)
    assert chat(limited_web.url, served["b"], "chat.one@1", "x").status_code == 200


def test_a_full_queue_refuses_and_one_key_cannot_starve_another(limited_web, served, operator_client):
    full = refusals(operator_client, "chat.one@1", "QUEUE_FULL") or 0
    began = time.monotonic()
    ended: dict[str, tuple[int, str, float]] = {}

    def call(name: str, who: str, text: str, stream: bool = True) -> None:
        answer = chat(limited_web.url, served[who], "chat.one@1", text, stream)
        code = answer.json()["code"] if answer.status_code != 200 else ""
        ended[name] = (answer.status_code, code, time.monotonic() - began)

    threads = [threading.Thread(target=call, args=("holder", "c", words(5)))]  # about 1 s
    threads[0].start()
    time.sleep(0.3)
    for i in range(1, 5):  # a floods: four waiting fill the queue (MAX_WAITING)
        threads.append(threading.Thread(target=call, args=(f"a{i}", "a", words(2))))
        threads[-1].start()
        time.sleep(0.05)
    time.sleep(0.2)
    asked = time.monotonic() - began
    call("a5", "a", "x")  # a fifth of a's: the queue is full, a holds the most: refused at once
    assert ended["a5"][:2] == (503, "QUEUE_FULL") and ended["a5"][2] - asked < 0.5, ended
    # b has none waiting: it takes the place of a's newest, which is refused instead.
    threads.append(threading.Thread(target=call, args=("b1", "b", words(2))))
    threads[-1].start()
    for thread in threads:
        thread.join(20)
    assert ended["a4"][:2] == (503, "QUEUE_FULL"), ended
    assert {name for name, (status, _, _) in ended.items() if status == 200} == {
        "holder",
        "a1",
        "a2",
        "a3",
        "b1",
    }
    # Served in turn: a's first, then b's one request, then the rest of a's backlog.
    order = sorted(("holder", "a1", "a2", "a3", "b1"), key=lambda name: ended[name][2])
    assert order == ["holder", "a1", "b1", "a2", "a3"], ended
    # Both QUEUE_FULL refusals (the newcomer turned away, the waiter pushed out) on /metrics.
    assert wait_until(lambda: refusals(operator_client, "chat.one@1", "QUEUE_FULL") == full + 2, 3)


def test_a_client_that_leaves_while_waiting_leaves_the_queue(limited_web, served, operator_client):
    holder = threading.Thread(target=chat, args=(limited_web.url, served["a"], "chat.one@1", words(30), True))
    holder.start()  # holds the one slot for about 6 s
    time.sleep(0.3)
    gave_up: list[type[Exception]] = []

    def leaving() -> None:
        try:
            chat(limited_web.url, served["b"], "chat.one@1", "x", timeout=2.5)
        except httpx.ReadTimeout as exc:  # gives up while queued, closing its connection
            gave_up.append(type(exc))

    waiting = threading.Thread(target=leaving)
    waiting.start()
    assert wait_until(lambda: depth(operator_client, "chat.one@1") == 1, 3)
    waiting.join(5)
    assert gave_up == [httpx.ReadTimeout]
    # It left the queue at once, while the holder still streams: a waiter left behind would be counted
    # until the holder's end, and then handed the slot.
    assert wait_until(lambda: depth(operator_client, "chat.one@1") == 0, 2)
    assert holder.is_alive()
    holder.join(15)
    # No slot was lost with it: the next request is served at once.
    quick = time.monotonic()
    assert chat(limited_web.url, served["c"], "chat.one@1", "x").status_code == 200
    assert time.monotonic() - quick < 1.0
    assert "POST /v1/chat/completions -> 499 in" in limited_web.process.log()
