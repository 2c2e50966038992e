"""Health from the data plane (issue 18): the gateway's probes of its backends, with real echo engines,
real Redis and real gunicorn processes. A frozen backend (SIGSTOP) is out of rotation within seconds with
no client error beyond the requests already in flight to it, and back after SIGCONT; a backend found
down by one gateway process is out for another; the card, the API and /metrics show the probe state."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import httpx
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User

from apps.clusters.tests.factories import (
    bind,
    cluster_with,
    credential,
    echo_backend,
    loopback_node,
    running_server,
)
from apps.gateway.lbstate import BENCH_KEY, FAILS_KEY, SharedState
from apps.gateway.probe import PROBES_KEY, read_verdicts, summary
from tests.fixtures import (
    LiveWeb,
    run_in_own_loop,
    start_web,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def pair(tmp_path):
    """Two real echo engines, "steady" and "frozen"; the frozen one is always resumed at the end."""
    started = [echo_backend(tmp_path, name) for name in ("steady", "frozen")]
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(PROBES_KEY)
    yield started
    for process, _ in started:
        if process.process.poll() is None:
            os.killpg(process.process.pid, signal.SIGCONT)
            os.killpg(process.process.pid, signal.SIGTERM)
            process.process.wait(10)


def as_backend(key: str, name: str, port: int) -> SimpleNamespace:
    return SimpleNamespace(key=key, name=name, url=f"http://127.0.0.1:{port}", health_path="/health")


def test_the_probe_marks_a_frozen_backend_down_for_every_process_and_up_again(pair, settings):
    settings.GATEWAY_PROBE_TIMEOUT_MS = 300
    (_, steady_port), (frozen_proc, frozen_port) = pair
    steady = as_backend("p-steady", "pool/steady", steady_port)
    frozen = as_backend("p-frozen", "pool/frozen", frozen_port)
    first, second = SharedState(), SharedState()
    first.process_id, second.process_id = "host:1", "host:2"
    seen: dict[str, object] = {}

    async def drill() -> None:
        # Never probed: a request's slow path probes at once and waits for it (bounded by the timeout).
        assert await first.probes.usable([steady, frozen]) == [steady, frozen]
        await first.flush()
        await second.flush()
        seen["second_before"] = second.probes.healthy  # takes the first's "up" before probing itself
        os.kill(frozen_proc.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        for _ in range(settings.GATEWAY_PROBE_FAILURES):
            await first.probes.probe(frozen)
        seen["took"] = time.monotonic() - started
        seen["first_down"] = first.probes.healthy
        seen["why"] = first.probes.why_not([frozen])
        await first.flush()
        await second.flush()
        seen["second_down"] = second.probes.healthy
        seen["second_usable"] = await second.probes.usable([steady, frozen])
        os.kill(frozen_proc.process.pid, signal.SIGCONT)
        await first.probes.probe(frozen)
        await first.flush()
        await second.flush()
        seen["second_back"] = second.probes.healthy

    run_in_own_loop(drill)
    # Only this test's two backends are judged: the shared hash may also hold a fresh verdict another
    # test's web process wrote about its own backend just before it stopped (seen in a fresh-clone CI).
    for name in ("second_before", "first_down", "second_down", "second_back"):
        seen[name] = seen[name] & {"p-steady", "p-frozen"}  # type: ignore[operator]
    assert seen["second_before"] == {"p-steady", "p-frozen"}
    assert seen["first_down"] == {"p-steady"}
    assert "no answer within 0.3 s" in str(seen["why"])
    assert float(seen["took"]) < settings.GATEWAY_PROBE_FAILURES * 0.3 + 0.5  # type: ignore[arg-type]
    # Found down by the first process: out for the second, which never probed it down itself.
    assert seen["second_down"] == {"p-steady"} and seen["second_usable"] == [steady]
    assert seen["second_back"] == {"p-steady", "p-frozen"}
    verdicts = read_verdicts()
    assert verdicts is not None and summary(verdicts["p-frozen"])["state"] == "up"


def test_a_probe_that_times_out_while_requests_are_answered_is_not_counted(pair, settings):
    """A busy engine (or this process's loop, late under load) is not a dead one."""
    settings.GATEWAY_PROBE_TIMEOUT_MS = 200
    _, (frozen_proc, frozen_port) = pair
    backend = as_backend("p-busy", "pool/busy", frozen_port)
    state = SharedState()

    async def busy() -> list[bool]:
        await state.probes.probe(backend)
        verdicts = []
        os.kill(frozen_proc.process.pid, signal.SIGSTOP)
        try:
            for _ in range(settings.GATEWAY_PROBE_FAILURES + 1):
                probing = asyncio.ensure_future(state.probes.probe(backend))
                await asyncio.sleep(0.05)
                state.served_quickly("p-busy")  # a real answer from it meanwhile
                await probing
                verdicts.append("p-busy" in state.probes.healthy)
            return verdicts
        finally:
            os.kill(frozen_proc.process.pid, signal.SIGCONT)

    out: list[list[bool]] = []
    run_in_own_loop(lambda: _collect(busy, out))
    assert out == [[True] * (settings.GATEWAY_PROBE_FAILURES + 1)]


def test_without_redis_each_process_goes_on_with_its_own_probes(pair, settings):
    """Redis away is never a total outage: the probes need neither Redis nor history."""
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    (_, steady_port), _ = pair
    backend = as_backend("p-alone", "pool/alone", steady_port)
    alone = SharedState()
    out: list[object] = []

    odd = SimpleNamespace(key="p-odd", name="pool/odd", url="https://127.0.0.1:1", health_path="/health")

    async def serve() -> None:
        out.append(await alone.probes.usable([backend]))
        await alone.flush()
        out.append(alone.probes.healthy)
        out.append(await alone.probes.usable([odd]))  # a failed probe, never an error on the request

    run_in_own_loop(serve)
    assert alone.redis_ok is False
    assert out == [[backend], {"p-alone"}, []]
    assert "no health answer (ConnectFailed" in alone.probes.why_not([odd])


async def _collect(coroutine_function, out: list) -> None:
    out.append(await coroutine_function())


@dataclass
class Result:
    started: float
    ended: float
    status: int  # 0: no answer (the client's timeout)
    backend: str
    code: str = ""


def steady_load(url: str, key: str, stop: threading.Event, results: list[Result], threads: int) -> list:
    def one() -> None:
        with httpx.Client(timeout=3) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    answer = client.post(
                        url + "/v1/embeddings",
                        json={"model": "rag.embedding@1", "input": "x"},
                        headers={"Authorization": f"Bearer {key}"},
                    )
                    code = answer.json().get("code", "") if answer.status_code != 200 else ""
                    results.append(
                        Result(
                            started,
                            time.monotonic(),
                            answer.status_code,
                            answer.headers.get("x-modelforge-backend", ""),
                            code,
                        )
                    )
                except httpx.TimeoutException:
                    results.append(Result(started, time.monotonic(), 0, ""))

    workers = [threading.Thread(target=one, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    return workers


def probe_state(key: str) -> str:
    return str(summary((read_verdicts() or {}).get(key))["state"])


def test_a_frozen_backend_under_load_is_out_within_seconds_and_back_after_sigcont(
    live_web, pair, operator_client, client
):
    (_, steady_port), (frozen_proc, frozen_port) = pair
    node = loopback_node()
    steady, frozen = running_server(node, "steady", steady_port), running_server(node, "frozen", frozen_port)
    cluster = cluster_with("pool", [(steady, 1), (frozen, 1)])
    bind("rag.embedding@1", cluster=cluster)
    key = credential(["rag.embedding@1"])

    def ok():
        return (
            httpx.post(
                live_web.url + "/v1/embeddings",
                json={"model": "rag.embedding@1", "input": "x"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=5,
            ).status_code
            == 200
        )

    assert wait_until(ok, 15)
    assert wait_until(lambda: probe_state(str(frozen.pk)) == "up", 10)
    stop, results = threading.Event(), list[Result]()
    workers = steady_load(live_web.url, key, stop, results, threads=6)
    try:
        time.sleep(2)
        served_before = Counter(r.backend for r in results if r.status == 200)
        stopped_at = time.monotonic()
        os.kill(frozen_proc.process.pid, signal.SIGSTOP)
        assert wait_until(lambda: probe_state(str(frozen.pk)) == "down", 15, interval=0.1)
        down_at = time.monotonic()
        # The card and the API say so, beside the sin-bin.
        card = operator_client.get(f"/api/v1/clusters/{cluster.pk}/load-balancer").json()
        row = {m["member"]: m for m in card["members"]}["frozen"]
        assert row["probe"]["state"] == "down" and "probe_failed" in row["reasons"]
        assert "failing its health probe since" in row["reason"]
        client.force_login(User.objects.create_user("ops", is_staff=True))
        page = client.get(f"/clusters/{cluster.pk}/").content.decode()
        assert "probe failed" in page and 'probe-badge" title=' in page
        scraped = operator_client.get("/metrics").content.decode()
        gauge = f'modelforge_gateway_backend_probe_up{{backend="pool/frozen",server="{frozen.pk}"}} 0.0'
        assert gauge in scraped
        time.sleep(4)
        continued_at = time.monotonic()
        os.kill(frozen_proc.process.pid, signal.SIGCONT)

        def back() -> bool:
            return any(r.backend == "pool/frozen" and r.started > continued_at for r in list(results))

        assert wait_until(back, 10, interval=0.1)
        back_at = time.monotonic()
        time.sleep(1)
    finally:
        stop.set()
        os.kill(frozen_proc.process.pid, signal.SIGCONT)
        for worker in workers:
            worker.join(10)
    assert served_before["pool/frozen"] > 0 and served_before["pool/steady"] > 0
    # Benched by probe within seconds: two probes without an answer (every 2 s, 1 s each) and a flush.
    assert down_at - stopped_at <= 8, down_at - stopped_at
    failed = [r for r in results if r.status != 200]
    # No client error but the requests already in flight to the frozen backend (the client gives up on
    # them after 3 s): each started before the probe took it out, none is an answer from the gateway.
    assert all(r.status == 0 for r in failed), Counter((r.status, r.code) for r in failed)
    assert all(r.started < down_at for r in failed), [(r.started - stopped_at) for r in failed]
    assert len(failed) <= 2 * 6
    # While it was out, every request was served by the other one.
    out = [r for r in results if down_at + 0.2 < r.started < continued_at]
    assert len(out) > 20 and {r.backend for r in out} == {"pool/steady"}
    assert back_at - continued_at <= 6
    print(
        f"SIGSTOP drill: out after {down_at - stopped_at:.1f} s, back after {back_at - continued_at:.1f} s, "
        f"{len(results)} requests, {len(failed)} in flight lost, {len(out)} served while it was out"
    )


@pytest.fixture
def slow_prober_web(live_web, tmp_path) -> Iterator[LiveWeb]:
    """A second gateway process whose own probes come once a minute: within a test it knows a backend is
    down only from the other process."""
    web = start_web(tmp_path / "second-web.log", MODELFORGE_GATEWAY_PROBE_EVERY_S="60")
    yield web
    web.process.stop()


def test_a_backend_found_down_by_one_gateway_process_is_out_for_another(live_web, slow_prober_web, pair):
    (_, steady_port), (frozen_proc, frozen_port) = pair
    node = loopback_node()
    steady, frozen = running_server(node, "steady", steady_port), running_server(node, "frozen", frozen_port)
    bind("rag.embedding@1", cluster=cluster_with("pool", [(steady, 1), (frozen, 1)]))
    key = credential(["rag.embedding@1"])

    def served_by(url: str, count: int = 10) -> Counter[str]:
        seen: Counter[str] = Counter()
        for _ in range(count):
            answer = httpx.post(
                url + "/v1/embeddings",
                json={"model": "rag.embedding@1", "input": "x"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=5,
            )
            assert answer.status_code == 200, answer.text
            seen[answer.headers["x-modelforge-backend"]] += 1
        return seen

    # Both processes route to both (each probed them at its first request).
    assert wait_until(lambda: served_by(live_web.url, 4)["pool/frozen"] > 0, 15)
    assert wait_until(lambda: served_by(slow_prober_web.url, 4)["pool/frozen"] > 0, 15)
    os.kill(frozen_proc.process.pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: probe_state(str(frozen.pk)) == "down", 15, interval=0.1)
        time.sleep(1.5)  # the other process's next flush reads it
        # The slow prober last saw it up; the first process's verdict takes it out there too.
        assert served_by(slow_prober_web.url, 20) == {"pool/steady": 20}
    finally:
        os.kill(frozen_proc.process.pid, signal.SIGCONT)
    assert wait_until(lambda: served_by(slow_prober_web.url, 4)["pool/frozen"] > 0, 10)


def test_every_backend_down_is_a_named_503_at_once_and_a_lower_tier_serves_first(live_web, pair):
    (_, steady_port), (frozen_proc, frozen_port) = pair
    node = loopback_node()
    frozen = running_server(node, "frozen", frozen_port)
    bind("rag.embedding@1", server=frozen, tier=0)
    key = credential(["rag.embedding@1"])

    def call() -> httpx.Response:
        return httpx.post(
            live_web.url + "/v1/embeddings",
            json={"model": "rag.embedding@1", "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )

    assert wait_until(lambda: call().status_code == 200, 15)
    os.kill(frozen_proc.process.pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: probe_state(str(frozen.pk)) == "down", 15, interval=0.1)
        started = time.monotonic()
        refused = call()
        assert time.monotonic() - started < 1.5  # at once, not held (120 s) by a backend that does not answer
        assert refused.status_code == 503 and refused.json()["code"] == "NO_HEALTHY_BACKEND"
        assert refused.headers["retry-after"] == str(settings.GATEWAY_PROBE_EVERY_S)
        assert "frozen" in refused.json()["message"] and "health probe" in refused.json()["message"]
        # A second tier: a tier whose only backend does not answer is passed over, as one with none running.
        bind("rag.embedding@1", server=running_server(node, "steady", steady_port), tier=1)
        assert wait_until(lambda: call().headers.get("x-modelforge-backend") == "steady", 10)
    finally:
        os.kill(frozen_proc.process.pid, signal.SIGCONT)
    # Back, it serves again from the first tier.
    assert wait_until(lambda: call().headers.get("x-modelforge-backend") == "frozen", 10)


def test_a_backend_benched_by_one_gateway_process_is_benched_by_the_other(live_web, slow_prober_web, pair):
    """Issue 18 item 5, the sin-bin's half: the second process (default bench time, 30 s) benches a backend
    after its failures; the first routes around it, though it saw none of them."""
    (_, steady_port), (_, other_port) = pair
    node = loopback_node()
    one, two = running_server(node, "one", steady_port), running_server(node, "two", other_port)
    bind("rag.embedding@1", cluster=cluster_with("pool", [(one, 1), (two, 1)]))
    key = credential(["rag.embedding@1"])
    store = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    store.delete(BENCH_KEY, FAILS_KEY.format(key=one.pk), FAILS_KEY.format(key=two.pk))

    def call(url: str, text: str = "x") -> httpx.Response:
        return httpx.post(
            url + "/v1/embeddings",
            json={"model": "rag.embedding@1", "input": text},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )

    try:
        assert wait_until(lambda: call(slow_prober_web.url).status_code == 200, 15)
        assert wait_until(lambda: call(live_web.url).status_code == 200, 15)
        # Failures (the engine asked to answer 502) through the second process, until one is benched.
        for _ in range(20):
            assert call(slow_prober_web.url, "__status_502__").status_code == 502
            if store.hlen(BENCH_KEY):
                break
        benched = {k.decode() if isinstance(k, bytes) else k for k in store.hkeys(BENCH_KEY)}
        assert len(benched) == 1
        # A good answer from the other ends its run of failures (it is not benched too).
        assert call(slow_prober_web.url).status_code == 200
        name = "pool/one" if benched == {str(one.pk)} else "pool/two"
        time.sleep(1.5)  # the first process's next flush reads the bench list
        seen = Counter(call(live_web.url).headers["x-modelforge-backend"] for _ in range(10))
        assert name not in seen and sum(seen.values()) == 10
    finally:
        store.delete(BENCH_KEY, FAILS_KEY.format(key=one.pk), FAILS_KEY.format(key=two.pk))
