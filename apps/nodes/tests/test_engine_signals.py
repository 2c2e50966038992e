"""Engine signals through the control plane: the heartbeat accepts or refuses them at the boundary, keeps
them in one Redis hash (no database write), stays a 200 with Redis away, and the readers get them back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from apps.gateway.engines import decode_read, fresh_signals, queue_read
from apps.nodes.engine_signals import (
    ENGINE_SIGNALS_KEY,
    FIELD_FORGOTTEN_AFTER_S,
    GATHER_S,
    EngineSignals,
    EngineSignalsWriter,
    aread_engine_signals,
    read_engine_signals,
    write_engine_signals,
)
from apps.nodes.heartbeat import MAX_SERVERS, EngineReport, ServerReport
from apps.nodes.tests.factories import heartbeat_report, make_node
from tests.fixtures import free_port, run_in_own_loop, start_web, wait_until

PATH = "/api/v1/agent/heartbeat"


@pytest.fixture
def store() -> Any:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(ENGINE_SIGNALS_KEY)
    yield client
    client.delete(ENGINE_SIGNALS_KEY)


def engine(running: int = 1, waiting: int = 0, kv: float | None = 0.5, at: float = 1764560000.0) -> dict:
    return {"running": running, "waiting": waiting, "kv_cache_used": kv, "at": at}


def post(url: str, credential: str, report: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        url + PATH,
        content=json.dumps(report).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {credential}"},
        timeout=10,
    )


# --- the heartbeat ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_heartbeats_engine_signals_land_in_redis_stamped_with_the_node_and_the_control_planes_clock(
    live_web, store
):
    node, credential = make_node()
    first, second, quiet = (str(uuid.uuid4()) for _ in range(3))
    report = heartbeat_report(
        servers=[
            {"server_id": first, "engine": engine(3, 2, 0.25)},
            {"server_id": second, "engine": engine(0, 0, None)},
            {"server_id": quiet},  # reported, but its engine says nothing: nothing written for it
        ]
    )
    before = time.time()

    response = post(live_web.url, credential, report)

    assert response.status_code == 200, response.text
    assert wait_until(lambda: store.hlen(ENGINE_SIGNALS_KEY) == 2, 5)
    signals = read_engine_signals(store)
    assert set(signals) == {first, second}
    assert (signals[first].running, signals[first].waiting, signals[first].kv_cache_used) == (3, 2, 0.25)
    assert signals[second].kv_cache_used is None
    assert signals[first].node_id == str(node.pk)
    # The agent said 2025-12-01; the record says when the heartbeat arrived, by the control plane's clock.
    assert before - 1 <= signals[first].at <= time.time() + 1
    assert signals[first].fresh(time.time(), settings.ENGINE_SIGNALS_MAX_AGE_S)
    assert 0 < store.ttl(ENGINE_SIGNALS_KEY) <= 3600


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
@pytest.mark.parametrize(
    ("servers", "where"),
    [
        ([{"server_id": "s", "engine": engine(1)}], "$.servers[0].server_id"),
        ([{"server_id": str(uuid.uuid4()), "engine": engine(running=-1)}], "$.servers[0].engine.running"),
        ([{"server_id": str(uuid.uuid4()), "engine": engine(waiting=2**40)}], "$.servers[0].engine.waiting"),
        ([{"server_id": str(uuid.uuid4()), "engine": engine(kv=1.5)}], "$.servers[0].engine.kv_cache_used"),
        ([{"server_id": str(uuid.uuid4()), "engine": engine(kv=-0.1)}], "$.servers[0].engine.kv_cache_used"),
        ([{"server_id": str(uuid.uuid4()), "engine": {**engine(), "at": -5}}], "$.servers[0].engine.at"),
        ([{"server_id": str(uuid.uuid4()), "engine": {**engine(), "running": "3"}}], "$.servers[0].engine"),
        ([{"server_id": str(uuid.uuid4()), "engine": {**engine(), "load": 1}}], "$.servers[0].engine"),
        ([{"server_id": str(uuid.uuid4()), "engine": {"running": 1, "at": 1}}], "$.servers[0].engine"),
        ([{"server_id": "6b1f7c1e-3f0a-4c5e-9a52-1d2e3f4a5b6c"}] * 2, "$.servers[1]"),
        ([{"server_id": str(uuid.uuid4())} for _ in range(MAX_SERVERS + 1)], "$.servers"),
        ({"server_id": str(uuid.uuid4())}, "$.servers"),
    ],
)
def test_bad_engine_signals_are_a_400_naming_the_field_and_nothing_is_written(
    live_web, store, servers, where
):
    node, credential = make_node()

    response = post(live_web.url, credential, heartbeat_report(servers=servers))

    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "VALIDATION_ERROR"
    assert f"`{where}" in body["message"]
    node.refresh_from_db()
    assert node.last_heartbeat_at is None  # the whole heartbeat refused, not half-recorded
    time.sleep(0.2)
    assert store.hlen(ENGINE_SIGNALS_KEY) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_heartbeat_with_an_unknown_credential_writes_no_signals(live_web, store):
    report = heartbeat_report(servers=[{"server_id": str(uuid.uuid4()), "engine": engine()}])

    response = post(live_web.url, "not-a-credential-of-any-node", report)

    assert response.status_code == 401
    time.sleep(0.2)
    assert store.hlen(ENGINE_SIGNALS_KEY) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_with_redis_away_heartbeats_carrying_signals_are_still_recorded_and_the_log_says_so_once(
    live_web, tmp_path: Path
):
    """A web process whose Redis is not there (nothing listens on its port)."""
    web = start_web(tmp_path / "web.log", MODELFORGE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    try:
        node, credential = make_node()
        report = heartbeat_report(servers=[{"server_id": str(uuid.uuid4()), "engine": engine()}])
        started = time.monotonic()
        answers = [post(web.url, credential, report) for _ in range(5)]
        took = time.monotonic() - started
        node.refresh_from_db()
        # The signals are written GATHER_S after the heartbeat that carried them, so the warning can come
        # after the last answer (CI, 2026-12-02); more heartbeats meanwhile must not repeat it.
        dropped = "engine signals from heartbeats are dropped"
        assert wait_until(lambda: dropped in web.process.log(), 5), web.process.log()
        answers += [post(web.url, credential, report) for _ in range(3)]
        time.sleep(3 * GATHER_S)
    finally:
        web.process.stop()
    log = web.process.log()
    assert [a.status_code for a in answers] == [200] * 8, answers[-1].text
    assert node.last_heartbeat_at is not None
    assert took < 5, took  # nobody waited on Redis
    assert log.count("engine signals from heartbeats are dropped") == 1, log


# --- write and read back -------------------------------------------------------------------------------


def test_written_signals_read_back_sync_and_async_and_through_a_callers_pipeline(store):
    now = round(time.time(), 3)  # kept to the millisecond
    written = {
        "a": EngineSignals(2, 1, 0.75, now, "node-1"),
        "b": EngineSignals(0, 0, None, now - 60, "node-2"),
    }
    write_engine_signals(store, written)

    assert read_engine_signals(store, now) == written

    async def read_async() -> dict[str, EngineSignals]:
        client = aioredis.Redis.from_url(settings.CELERY_BROKER_URL)
        try:
            return await aread_engine_signals(client, now)
        finally:
            await client.aclose()

    assert run_in_own_loop(read_async) == written  # a browser test's loop may hold this thread
    with store.pipeline(transaction=False) as pipe:
        pipe.get("modelforge:routing:version")  # the caller's own command
        queue_read(pipe)
        _, raw = pipe.execute()
    assert decode_read(raw, now) == written


def test_fresh_signals_are_recent_and_from_the_node_the_server_runs_on():
    now = 1000.0
    signals = {
        "recent": EngineSignals(1, 0, None, now - 5, "n1"),
        "stale": EngineSignals(1, 0, None, now - 25, "n1"),
        "moved": EngineSignals(1, 0, None, now - 1, "n-old"),
        "future": EngineSignals(1, 0, None, now + 30, "n1"),
    }
    assert set(fresh_signals(signals, now, max_age=20)) == {"recent", "moved"}
    nodes = {"recent": "n1", "stale": "n1", "moved": "n2", "future": "n1"}
    assert set(fresh_signals(signals, now, max_age=20, nodes=nodes)) == {"recent"}


def test_the_default_freshness_limit_is_two_heartbeat_intervals():
    assert settings.ENGINE_SIGNALS_MAX_AGE_S == 2 * settings.HEARTBEAT_INTERVAL


def test_unreadable_and_long_forgotten_fields_are_skipped_and_deleted(store):
    now = time.time()
    store.hset(
        ENGINE_SIGNALS_KEY,
        mapping={
            "ok": EngineSignals(1, 2, None, now, "n").encode(),
            "old": EngineSignals(1, 2, None, now - FIELD_FORGOTTEN_AFTER_S - 1, "n").encode(),
            "junk": b"not json",
            "negative": json.dumps({"running": -1, "waiting": 0, "at": now}),
            "share": json.dumps({"running": 1, "waiting": 0, "kv_cache_used": 3, "at": now}),
        },
    )

    assert set(read_engine_signals(store, now)) == {"ok"}
    assert store.hkeys(ENGINE_SIGNALS_KEY) == [b"ok"]


def test_the_writer_never_waits_on_redis_and_a_dead_redis_is_said_once(settings, caplog):
    caplog.set_level(logging.WARNING, logger="modelforge.engines")
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    reports = [
        ServerReport(server_id=uuid.uuid4(), engine=EngineReport(running=1, waiting=0, at=1.0)),
        ServerReport(server_id=uuid.uuid4(), engine=None),
    ]

    async def heartbeats() -> float:
        writer = EngineSignalsWriter()
        started = time.monotonic()
        for _ in range(20):
            writer.submit("node", reports, time.time())
        took = time.monotonic() - started
        await asyncio.sleep(0.5)  # the failed write, then every later one skipped
        for _ in range(5):
            writer.submit("node", reports, time.time())
            await asyncio.sleep(0.01)
        assert writer.written == 0
        return took

    took = run_in_own_loop(heartbeats)
    assert took < 0.05
    assert caplog.text.count("engine signals from heartbeats are dropped") == 1
