"""Limits per client credential (issue 18), held across two gateway processes through Redis: requests
per minute exactly, a token budget that stops a key, concurrent requests, 429 with Retry-After and a
named code. Real gunicorn processes on two ports, real backend, Redis and PostgreSQL."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User

from apps.clusters.models import ClientCredential
from apps.clusters.tests.factories import bind, credential, echo_backend, loopback_node, running_server
from apps.gateway.lbstate import PROCESSES_KEY
from apps.gateway.limits import Limiter, Limits
from apps.gateway.resp import LeanRedis
from modelforge.embedded import EmbeddedRedis
from tests.fixtures import (
    LiveWeb,
    clear_limit_counts,
    clear_usage,
    free_port,
    run_in_own_loop,
    start_web,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def echo(tmp_path):
    clear_usage()
    clear_limit_counts()
    process, port = echo_backend(tmp_path, "echo-l")
    yield port
    os.killpg(process.process.pid, signal.SIGTERM)
    process.process.wait(10)


@pytest.fixture
def second_web(live_web, tmp_path) -> Iterator[LiveWeb]:
    """Another web process on a port of its own, on the same database and Redis: a second gateway."""
    web = start_web(tmp_path / "second-web.log")
    yield web
    web.process.stop()


def chat(url: str, key: str, text: str = "a b c", **extra: object) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "chat.echo@1", "messages": [{"role": "user", "content": text}], **extra},
        headers={"Authorization": f"Bearer {key}"},
        timeout=20,
    )


def limited(key: str, operator_client, **limits: int | None) -> None:
    pk = ClientCredential.objects.get(display_prefix=key[:12]).pk
    body = {
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "max_concurrent": None,
        "tokens_per_day": None,
        "tokens_per_month": None,
        **limits,
    }
    answer = operator_client.post(f"/api/v1/client-credentials/{pk}/limits", body, format="json")
    assert answer.status_code == 200, answer.content


def test_sixty_a_minute_is_sixty_across_two_gateway_processes(live_web, second_web, echo, operator_client):
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-l", echo))
    key = credential(["chat.echo@1"])
    assert chat(live_web.url, key).status_code == 200 and chat(second_web.url, key).status_code == 200
    limited(key, operator_client, requests_per_minute=60)
    # Both processes have the limit once their tables are rebuilt (the change notice, within a second).
    time.sleep(1.5)
    urls = [live_web.url, second_web.url] * 50
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda url: chat(url, key), urls))
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: 60, 429: 40}, statuses
    refused = [a for a in answers if a.status_code == 429]
    assert {a.json()["code"] for a in refused} == {"RATE_LIMITED"}
    assert all(1 <= int(a.headers["retry-after"]) <= 60 for a in refused)
    assert "60 requests per minute" in refused[0].json()["message"]
    # Each process served some of the 60: the limit is shared, not per process.
    served = Counter(u for u, a in zip(urls, answers, strict=True) if a.status_code == 200)
    assert served[live_web.url] > 0 and served[second_web.url] > 0
    use = operator_client.get(
        f"/api/v1/client-credentials/{ClientCredential.objects.get(display_prefix=key[:12]).pk}/use"
    )
    assert use.json()["requests_last_minute"] == 60 and use.json()["limits_enforced"] is True


def test_a_token_budget_stops_a_key_at_the_budget(live_web, echo, operator_client, client):
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-l", echo))
    key = credential(["chat.echo@1"])
    limited(key, operator_client, tokens_per_day=12)
    pk = ClientCredential.objects.get(display_prefix=key[:12]).pk
    assert wait_until(lambda: chat(live_web.url, key).status_code == 200, 10)  # 3 + 4 = 7 tokens
    # The engine's count is added within about a second of the answer.
    assert wait_until(
        lambda: operator_client.get(f"/api/v1/client-credentials/{pk}/use").json()["tokens_today"] == 7, 10
    )
    assert chat(live_web.url, key).status_code == 200  # 7 < 12: admitted, and takes the day to 14
    assert wait_until(lambda: chat(live_web.url, key).status_code == 429, 10)
    refused = chat(live_web.url, key)
    assert refused.json()["code"] == "BUDGET_EXHAUSTED"
    assert "12 tokens a day" in refused.json()["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 86400
    # Raising the budget lets it call again; the dashboard page shows the use against the limit.
    limited(key, operator_client, tokens_per_day=1000)
    assert wait_until(lambda: chat(live_web.url, key).status_code == 200, 10)
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get(f"/clusters/credentials/{pk}/").content.decode()
    assert 'id="use-tokens_per_day"' in page and "of 1000" in page


def test_concurrent_requests_are_held_to_the_limit(live_web, echo, operator_client):
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-l", echo))
    key = credential(["chat.echo@1"])
    limited(key, operator_client, max_concurrent=1)
    assert wait_until(lambda: chat(live_web.url, key, "x").status_code == 200, 10)
    # A stream of eight words takes the echo engine about 1.6 s: meanwhile a second call is refused.
    first: list[httpx.Response] = []
    streaming = threading.Thread(
        target=lambda: first.append(chat(live_web.url, key, "one two three four five six seven", stream=True))
    )
    streaming.start()
    time.sleep(0.5)
    second = chat(live_web.url, key, "x")
    streaming.join(20)
    assert second.status_code == 429 and second.json()["code"] == "RATE_LIMITED"
    assert "1 concurrent requests" in second.json()["message"]
    assert first and first[0].status_code == 200
    assert chat(live_web.url, key, "x").status_code == 200  # the slot was given back


def test_limits_are_validated(operator_client):
    key = credential(["chat.echo@1"])
    pk = ClientCredential.objects.get(display_prefix=key[:12]).pk
    answer = operator_client.post(
        f"/api/v1/client-credentials/{pk}/limits",
        {"requests_per_minute": 0, "tokens_per_minute": None, "max_concurrent": None, "tokens_per_day": None},
        format="json",
    )
    assert answer.status_code == 400 and answer.json()["code"] == "VALIDATION_ERROR"
    assert ClientCredential.objects.get(pk=pk).requests_per_minute is None
    # Past the column's bound: a 400 naming the field, never the database's error.
    too_big = operator_client.post(
        f"/api/v1/client-credentials/{pk}/limits",
        {
            "requests_per_minute": 2**31,
            "tokens_per_minute": None,
            "max_concurrent": None,
            "tokens_per_day": 2**63,
            "tokens_per_month": None,
        },
        format="json",
    )
    assert too_big.status_code == 400 and too_big.json()["code"] == "VALIDATION_ERROR"
    assert (
        "requests_per_minute" in too_big.json()["message"] and "tokens_per_day" in too_big.json()["message"]
    )
    minted = operator_client.post(
        "/api/v1/client-credentials",
        {"name": "limited", "scopes": ["chat.echo@1"], "requests_per_minute": 5},
        format="json",
    )
    assert minted.status_code == 201 and minted.json()["requests_per_minute"] == 5


def test_with_redis_away_a_limited_call_is_admitted_and_said_so(caplog):
    limiter = Limiter()
    import redis.asyncio as aioredis

    limiter._client = aioredis.Redis(port=free_port(), socket_connect_timeout=0.2)
    limiter._lean = LeanRedis(f"redis://127.0.0.1:{free_port()}/0")
    admitted: list[str | None] = []

    async def admit() -> None:
        admitted.append(await limiter.admit("1", Limits(requests_per_minute=1)))

    run_in_own_loop(admit)  # (a browser test may keep a loop running in this thread)
    assert admitted == [None]
    assert limiter.redis_ok is False
    assert any("limits are not enforced" in r.getMessage() for r in caplog.records)


def test_a_new_web_process_holds_a_limit_from_its_first_calls(echo, tmp_path, operator_client):
    # Regression (issue 47): a web process's call ids were drawn in gunicorn's master, before it forked its
    # workers, so two workers' first calls had the same ids and replaced each other's entries in the
    # window: 5 of 8 admitted at 3 a minute. A fresh Redis too (no script loaded), as after `make run`.
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-l", echo))
    key = credential(["chat.echo@1"])
    limited(key, operator_client, requests_per_minute=3)
    redis.Redis.from_url(settings.CELERY_BROKER_URL).script_flush()
    web = start_web(tmp_path / "fresh-web.log", MODELFORGE_WEB_WORKERS="2")
    try:
        # At once, so that both workers take calls with their first ids.
        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = Counter(pool.map(lambda _: chat(web.url, key).status_code, range(8)))
        assert statuses == {200: 3, 429: 5}, (statuses, web.process.log()[-3000:])
        # Each worker names itself in the load balancer's shared state, not by the master's pid.
        master = web.process.process.pid
        workers = {int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()}
        assert len(workers) == 2
        assert wait_until(lambda: bool(flushed_pids() & workers), 10), (flushed_pids(), master, workers)
        assert master not in flushed_pids()
    finally:
        web.process.stop()


def flushed_pids() -> set[int]:
    """The pids of the web processes of this host whose load-balancer state was flushed lately."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, decode_responses=True)
    named = [str(member).rsplit(":", 1) for member in client.zrange(PROCESSES_KEY, 0, -1)]
    return {int(pid) for host, pid in named if host == socket.gethostname()}


def test_a_limit_changed_under_load_holds_in_every_worker(echo, tmp_path, operator_client):
    # Issue 47: a limit saved while a credential is busy applies in every worker of a web process (each
    # rebuilds its table on the change notice), and from then on its window counts each admitted call once.
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-l", echo))
    key = credential(["chat.echo@1"])
    pk = ClientCredential.objects.get(display_prefix=key[:12]).pk
    web = start_web(tmp_path / "loaded-web.log", MODELFORGE_WEB_WORKERS="2")
    answers: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=20) as client:
            while not stop.is_set():
                answers.append(
                    client.post(
                        web.url + "/v1/chat/completions",
                        json={"model": "chat.echo@1", "messages": [{"role": "user", "content": "a"}]},
                        headers={"Authorization": f"Bearer {key}"},
                    ).status_code
                )

    clients = [threading.Thread(target=load) for _ in range(6)]
    try:
        for thread in clients:
            thread.start()
        assert wait_until(lambda: answers.count(200) >= 50, 20)  # busy, with no limit
        limited(key, operator_client, requests_per_minute=5)
        assert wait_until(lambda: 429 in answers, 10)
        stop.set()
        for thread in clients:
            thread.join(20)
        # Every worker has the limit: a burst at once, spread over both, is refused whole, and the window
        # holds the 5 calls the limit admitted (the calls before the change went through no window).
        with ThreadPoolExecutor(max_workers=10) as pool:
            burst = Counter(pool.map(lambda _: chat(web.url, key).status_code, range(10)))
        assert burst == {429: 10}, burst
        use = operator_client.get(f"/api/v1/client-credentials/{pk}/use").json()
        assert use["requests_last_minute"] == 5, use
        # Raised under load again: admitted again.
        stop.clear()
        clients = [threading.Thread(target=load) for _ in range(6)]
        for thread in clients:
            thread.start()
        limited(key, operator_client, requests_per_minute=100_000)
        served = len(answers)
        assert wait_until(lambda: 200 in answers[served:], 10)
    finally:
        stop.set()
        for thread in clients:
            thread.join(20)
        web.process.stop()


def test_a_limited_call_just_after_a_redis_restart_is_checked_not_admitted_unchecked(tmp_path, caplog):
    # Issue 47: the first call after Redis restarted found the old connection ended under it and was
    # admitted as if Redis were away, though a new connection answered (and loads the script it lost).
    restarted = EmbeddedRedis(tmp_path / "redis", free_port())
    restarted.start(persistent=False)
    limiter = Limiter()
    limiter._lean = LeanRedis(restarted.url)
    slots: list[str | None] = []

    async def admit_across_a_restart() -> None:
        slots.append(await limiter.admit("1", Limits(max_concurrent=5)))
        restarted.stop()  # (blocking the loop: the call below is the first to find the connection gone)
        restarted.start(persistent=False)
        slots.append(await limiter.admit("1", Limits(max_concurrent=5)))

    try:
        run_in_own_loop(admit_across_a_restart)
        # Checked both times (a concurrency slot is the check's; an unchecked call has none).
        assert None not in slots and len(slots) == 2
        assert limiter.redis_ok is True
        assert not any("not enforced" in r.getMessage() for r in caplog.records)
        assert redis.Redis.from_url(restarted.url).zcard("modelforge:limit:1:in-flight") == 1
    finally:
        restarted.stop()
