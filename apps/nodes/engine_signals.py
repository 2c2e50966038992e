"""Engine signals in Redis: what each server's engine last said of its load, for every gateway process.

The agent reads its engines' metrics at heartbeat time and reports them in the heartbeat
(``servers[].engine``, agent/engine_signals.py). The heartbeat endpoint puts them in one Redis hash,
``ENGINE_SIGNALS_KEY``: field = the server's id, value = compact JSON
``{"running", "waiting", "kv_cache_used", "at", "node"}`` where ``at`` is the control plane's clock when
the heartbeat arrived (one clock for writer and readers: a node's clock never decides freshness) and
``node`` the id of the node that reported it (the only node whose credential could write it).

No database write: the heartbeats that arrive within a tenth of a second go to Redis in one write, one
HSET of all their servers with the hash's EXPIRE in the same pipeline (``EngineSignalsWriter``). Best
effort: the heartbeat is answered without waiting for it, and with Redis unreachable the signals are
dropped, said once per outage in the log; Redis is not asked again for a few seconds, so an outage
costs no heartbeat anything.

Readers: ``read_engine_signals`` (redis-py) and ``aread_engine_signals`` (redis.asyncio), one HGETALL;
the gateway's once-a-second flush (apps/gateway/engines.py) and the servers' pages use them, and judge
freshness with ``EngineSignals.fresh`` against ``settings.ENGINE_SIGNALS_MAX_AGE_S``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

logger = logging.getLogger("modelforge.engines")

ENGINE_SIGNALS_KEY = "modelforge:engine:signals"
# The hash outlives its last write by this long: a fleet that stopped reporting leaves nothing behind.
KEY_TTL_S = 3600
# A field no heartbeat refreshed for this long (its server stopped or moved) is deleted by the next read.
FIELD_FORGOTTEN_AFTER_S = 600
# After Redis fails, signals are dropped without asking it for this long.
RETRY_REDIS_AFTER_S = 5.0
# The writer gathers heartbeats for this long before it writes them: at most ten writes a second per web
# process whatever the heartbeat rate (bench/heartbeats: --engine-servers), and a tenth of a second is
# nothing against signals refreshed once per heartbeat interval and read once a second.
GATHER_S = 0.1
TIMEOUT_S = 0.5


@dataclass(frozen=True)
class EngineSignals:
    """One server's engine load as its node last reported it."""

    running: int
    waiting: int
    kv_cache_used: float | None  # 0..1; None: the engine does not publish it
    at: float  # Unix seconds, the control plane's clock when the heartbeat carrying it arrived
    node_id: str = ""  # the node that reported it

    def fresh(self, now: float, max_age_s: float) -> bool:
        """Recent enough to act on: reported within ``max_age_s`` of ``now`` (and not from the future
        beyond a second of clock difference between two control-plane hosts)."""
        return -1.0 <= now - self.at <= max_age_s

    def encode(self) -> bytes:
        return json.dumps(
            {
                "running": self.running,
                "waiting": self.waiting,
                "kv_cache_used": self.kv_cache_used,
                "at": round(self.at, 3),
                "node": self.node_id,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> EngineSignals | None:
        """The value as written, or ``None`` for anything else (a foreign or damaged value is skipped)."""
        try:
            data = json.loads(raw)
            running, waiting, at = data["running"], data["waiting"], data["at"]
            kv = data.get("kv_cache_used")
            node = data.get("node", "")
        except (ValueError, TypeError, KeyError):
            return None
        counts_ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (running, waiting))
        at_ok = isinstance(at, int | float) and not isinstance(at, bool) and math.isfinite(at)
        kv_ok = kv is None or (isinstance(kv, int | float) and not isinstance(kv, bool) and 0 <= kv <= 1)
        if not (counts_ok and at_ok and kv_ok and isinstance(node, str)):
            return None
        return cls(running, waiting, None if kv is None else float(kv), float(at), node)


def max_age_s() -> float:
    """``MODELFORGE_ENGINE_SIGNALS_MAX_AGE_S``: older signals are not acted on."""
    return float(settings.ENGINE_SIGNALS_MAX_AGE_S)


def decode_signals(raw: Mapping[Any, Any], now: float) -> tuple[dict[str, EngineSignals], list[Any]]:
    """An HGETALL's answer as signals by server id, and the fields to forget (unreadable, or not
    refreshed for ``FIELD_FORGOTTEN_AFTER_S``)."""
    signals: dict[str, EngineSignals] = {}
    forgotten: list[Any] = []
    for field, value in raw.items():
        decoded = EngineSignals.decode(value)
        if decoded is None or now - decoded.at > FIELD_FORGOTTEN_AFTER_S:
            forgotten.append(field)
            continue
        signals[field.decode() if isinstance(field, bytes) else str(field)] = decoded
    return signals, forgotten


def read_engine_signals(client: redis.Redis, now: float | None = None) -> dict[str, EngineSignals]:
    """Every server's last engine signals, by server id (one HGETALL; fresh or not: judge with
    ``EngineSignals.fresh``). Fields unrefreshed for ``FIELD_FORGOTTEN_AFTER_S``, or unreadable, are
    deleted on the way. Redis errors are the caller's (``redis.RedisError``)."""
    raw = client.hgetall(ENGINE_SIGNALS_KEY)
    signals, forgotten = decode_signals(raw, time.time() if now is None else now)
    if forgotten:
        client.hdel(ENGINE_SIGNALS_KEY, *forgotten)
    return signals


async def aread_engine_signals(client: aioredis.Redis, now: float | None = None) -> dict[str, EngineSignals]:
    """``read_engine_signals`` on redis.asyncio."""
    raw = await client.hgetall(ENGINE_SIGNALS_KEY)
    signals, forgotten = decode_signals(raw, time.time() if now is None else now)
    if forgotten:
        await client.hdel(ENGINE_SIGNALS_KEY, *forgotten)
    return signals


@dataclass(frozen=True)
class EngineView:
    """One server's engine signals as a page or the API shows them."""

    state: str  # "reported" | "stale" | "not_reported" | "unknown" (Redis could not be asked)
    signals: EngineSignals | None = None
    age_s: float | None = None  # seconds since the heartbeat that carried them

    @property
    def kv_percent(self) -> int | None:
        kv = self.signals.kv_cache_used if self.signals else None
        return None if kv is None else round(kv * 100)

    def as_payload(self) -> dict[str, Any]:
        s = self.signals
        return {
            "state": self.state,
            "running": s.running if s else None,
            "waiting": s.waiting if s else None,
            "kv_cache_used": s.kv_cache_used if s else None,
            "reported_at": s.at if s else None,
        }


_views_client: tuple[str, redis.Redis] | None = None


def _client_for_views() -> redis.Redis:
    global _views_client
    url = str(settings.CELERY_BROKER_URL)
    if _views_client is None or _views_client[0] != url:  # tests point at Redis of their own
        _views_client = (
            url,
            redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S),
        )
    return _views_client[1]


def engine_view(server_id: str, node_id: str | None, now: float | None = None) -> EngineView:
    """What the server's engine last reported, for the dashboard and the servers API (one HGET; Redis
    away: ``unknown``, never an error). Signals from a node other than the server's are not shown."""
    try:
        raw = _client_for_views().hget(ENGINE_SIGNALS_KEY, server_id)
    except (redis.RedisError, OSError):
        return EngineView("unknown")
    signals = EngineSignals.decode(raw) if raw is not None else None
    if signals is None or (node_id is not None and signals.node_id != node_id):
        return EngineView("not_reported")
    current = time.time() if now is None else now
    state = "reported" if signals.fresh(current, max_age_s()) else "stale"
    return EngineView(state, signals, max(current - signals.at, 0.0))


def queue_engine_signals(pipe: Any, signals: Mapping[str, EngineSignals]) -> None:
    """The write, queued on a pipeline (sync or async): one HSET of every server, the hash's TTL renewed."""
    pipe.hset(ENGINE_SIGNALS_KEY, mapping={server: s.encode() for server, s in signals.items()})
    pipe.expire(ENGINE_SIGNALS_KEY, KEY_TTL_S)


def write_engine_signals(client: redis.Redis, signals: Mapping[str, EngineSignals]) -> None:
    """Record ``signals`` (server id -> signals) in one round trip; for in-process callers and tests."""
    if not signals:
        return
    with client.pipeline(transaction=False) as pipe:
        queue_engine_signals(pipe, signals)
        pipe.execute()


class EngineSignalsWriter:
    """The heartbeat endpoint's writer, one per process: ``submit`` never waits; whatever is submitted
    within ``GATHER_S`` of the first, or while a write is in flight, goes together in the next write (a
    server's latest signals win)."""

    def __init__(self) -> None:
        self._url: str | None = None
        self._client: tuple[asyncio.AbstractEventLoop, aioredis.Redis] | None = None
        self._pending: dict[str, EngineSignals] = {}
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self._down = False
        self.written = 0  # writes that succeeded, for tests and curiosity

    def submit(self, node_id: str, servers: Iterable[Any], now: float) -> None:
        """Queue the engine signals of one heartbeat's ``servers`` (``ServerReport``s) and make sure a
        write is on its way. Called on the event loop; returns at once."""
        for server in servers:
            engine = server.engine
            if engine is None:
                continue
            self._pending[str(server.server_id)] = EngineSignals(
                engine.running, engine.waiting, engine.kv_cache_used, now, node_id
            )
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._flush())

    def _redis(self) -> aioredis.Redis:
        url = str(settings.CELERY_BROKER_URL)
        loop = asyncio.get_running_loop()
        if url != self._url or self._client is None or self._client[0] is not loop:
            self._url = url
            self._client = (
                loop,
                aioredis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S),
            )
        return self._client[1]

    async def _flush(self) -> None:
        while self._pending:
            await asyncio.sleep(GATHER_S)
            batch, self._pending = self._pending, {}
            if self._down and time.monotonic() < self._down_until:
                continue  # Redis failed a moment ago: dropped, not queued (they are stale by then anyway)
            try:
                async with self._redis().pipeline(transaction=False) as pipe:
                    queue_engine_signals(pipe, batch)
                    await pipe.execute()
            except (redis.RedisError, OSError) as exc:
                if not self._down:
                    logger.warning(
                        "Redis unreachable (%s): engine signals from heartbeats are dropped until it "
                        "answers; routing uses its own counts meanwhile",
                        type(exc).__name__,
                    )
                self._down = True
                self._down_until = time.monotonic() + RETRY_REDIS_AFTER_S
                continue
            if self._down:
                logger.warning("Redis reachable again: engine signals from heartbeats are recorded again")
            self._down = False
            self.written += 1


writer = EngineSignalsWriter()
