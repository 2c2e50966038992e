"""Load-balancer state shared by every web process through Redis: the sin-bin, traffic counters.

The data path stays lean: traffic counts accumulate in the process and a task of the serving loop flushes
them to Redis once a second, with the bench list read back in the same round trip (never on a request's
path: at a request a second, a flush on the path put a Redis round trip before nearly every request);
Redis is written per request only when a backend fails. If Redis is unreachable, each process carries on
with its own state and says so (log, ``redis_ok``, the dashboard) — never an error to the client.

The sin-bin follows Envoy's outlier detection: MODELFORGE_LB_CONSECUTIVE_FAILURES failures in a row
(5xx, connection errors, timeouts; never a 4xx, which is the backend judging the request and ends a run
of failures) bench a backend for MODELFORGE_LB_BASE_BENCH_S x the number of times
it was benched within MODELFORGE_LB_CHURN_WINDOW_S, capped at MODELFORGE_LB_MAX_BENCH_S; it returns by
itself when its time is up. Benched MODELFORGE_LB_CHURN_THRESHOLD times within the window raises
``lb_sin_bin_churn``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings

from apps.gateway.engines import ENGINE_SIGNALS_KEY, decode_read, fresh_signals
from apps.gateway.probe import PROBES_KEEP_S, PROBES_KEY, Prober
from apps.gateway.resp import LeanRedis, RespError
from apps.gateway.usage import Meter, Outbox

logger = logging.getLogger("modelforge.gateway")

FLUSH_EVERY_S = 1.0
# Traffic is counted per minute; drift compares shares over the last few minutes.
TRAFFIC_BUCKET_S = 60

BENCH_KEY = "modelforge:lb:bench"  # hash backend -> json {since, until, reason, count}
HISTORY_KEY = "modelforge:lb:history:{key}"  # sorted set of bench times, for churn
FAILS_KEY = "modelforge:lb:fails:{key}"
# Set (NX) by the one process that benches a backend, for the shortest bench: failures arriving together
# in several processes all see the run reach the limit, and only the first benches.
BENCHING_KEY = "modelforge:lb:benching:{key}"
TRAFFIC_KEY = "modelforge:lb:traffic:{bucket}"  # hash backend -> requests
ERRORS_KEY = "modelforge:lb:errors:{bucket}"  # hash backend -> failed requests
# hash backend -> answers 429 / 503: the backend is at capacity (seeds: a reason for drift). A 503 also
# moves the sin-bin's run of failures, as Envoy's 5xx detection does; neither is counted as an error.
BUSY_KEY = "modelforge:lb:busy:{bucket}"

# hash backend -> requests in flight, and "t:" + backend -> their estimated tokens, per process
INFLIGHT_KEY = "modelforge:lb:inflight:{process}"
TOKENS_FIELD = "t:"
# hash "hit:" / "all:" + backend -> requests routed by prefix affinity, and those sent to their prefix's
# home backend (the one holding it): the card's cache-hit share.
AFFINITY_KEY = "modelforge:lb:affinity:{bucket}"
# Tokens assumed per request the engine reports beyond what the gateways sent it (least_outstanding).
ENGINE_REQUEST_TOKENS = 512
# hash capability -> requests waiting in the admission queue, per process (apps/gateway/admission.py)
QUEUED_KEY = "modelforge:lb:queued:{process}"
PROCESSES_KEY = "modelforge:lb:processes"  # sorted set of live processes by last flush
# json {bucket, served, failed}: a cluster's traffic minute and its counts when its membership last changed
# (a member's server attached or detached, a member added, edited or removed). See ``shape_changed``.
SHAPE_KEY = "modelforge:lb:shape:{cluster}"
SHAPE_TTL_S = 3600  # longer than any window the card reads: an older change no longer matters
PROCESS_TTL_S = 5.0

ALERT_SIN_BIN_CHURN = "lb_sin_bin_churn"


@dataclass
class Bench:
    """A backend on the bench: since when, until when, why, and how many times in the window."""

    since: float
    until: float
    reason: str
    count: int

    def as_dict(self) -> dict[str, Any]:
        return {"since": self.since, "until": self.until, "reason": self.reason, "count": self.count}


class SharedState:
    """One per web process."""

    def __init__(self) -> None:
        self._client: aioredis.Redis | None = None
        self._lean: LeanRedis | None = None
        self.redis_ok = True
        self.benched: dict[str, Bench] = {}
        self._traffic: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._busy: Counter[str] = Counter()
        self.usage = Meter()
        self.outbox = Outbox()  # the usage taken from ``usage``, until Redis has it
        self._local_fails: Counter[str] = Counter()
        self._benching: set[str] = set()  # being benched by this process (between its awaits)
        self._local_history: dict[str, list[float]] = {}
        self.process_id = f"{socket.gethostname()}:{os.getpid()}"
        self.in_flight: Counter[str] = Counter()
        self.others_in_flight: Counter[str] = Counter()
        self.in_flight_tokens: Counter[str] = Counter()  # estimated tokens of those (least_outstanding)
        self.others_tokens: Counter[str] = Counter()
        # Requests running or waiting in each engine by its own count, as its agent last reported it (fresh
        # reports only; apps/gateway/engines.py): work the gateways did not send, or sent and forgot.
        self.engine_load: dict[str, int] = {}
        # The backends routed by least_outstanding (key -> node id): the flush reads their engines' signals
        # only (one HMGET), not every server's of the fleet.
        self.engines_wanted: dict[str, str] = {}
        self._affinity_hits: Counter[str] = Counter()
        self._affinity_routed: Counter[str] = Counter()
        # Web processes flushing to Redis, this one included (as of the last flush): admission's fair share.
        self.processes = 1
        self.queued: Counter[str] = Counter()  # capability -> waiting here (apps/gateway/admission.py)
        # Slots admission has handed to a waiter that has not resumed yet (Admission.reserved): published
        # with the in-flight counts, or a flush in that moment would show the other processes a free slot.
        self.reserved: Counter[str] = Counter()
        self._queued_written = False
        # Called after each flush has read the other processes' counts (admission hands out what they free).
        self.after_flush: Callable[[], None] | None = None
        self.flusher: asyncio.Task[None] | None = None
        self._flush_stopped = False
        # Answers from each backend up to the last flush (the counts above are taken by each flush).
        self._answered_flushed: Counter[str] = Counter()
        self.probes = Prober(self)  # health from the data plane (apps/gateway/probe.py)
        self._stale_probes: list[str] = []

    def start_flushing(self) -> None:
        """Flush once a second from a task of the running loop (the serving loop; started by the first
        request through the gateway)."""
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    async def stop_flushing(self) -> None:
        """Stop the flusher after the flush under way (tests); it is not started again."""
        self._flush_stopped = True
        if self.flusher is not None:
            await self.flusher

    async def _flush_forever(self) -> None:
        task = asyncio.current_task()
        while not self._flush_stopped:
            try:
                await self.flush()
            except Exception:  # never let the flusher die: the next second tries again
                logger.exception("load-balancer state not flushed")
            if task is not None and task.cancelling():
                # Cancelled during a Redis call that answered with its own error (redis-py's asyncio
                # client can turn a cancellation into a connection error): stop as asked, or the loop's
                # shutdown waits for this task for ever.
                raise asyncio.CancelledError
            if not self._flush_stopped:
                await asyncio.sleep(FLUSH_EVERY_S)

    def answered(self, key: str) -> int:
        """Requests ``key`` answered so far in this process (any answer, a 5xx included; not a refused
        connection or a timeout): the prober's passive evidence that a backend is alive."""
        return self._answered_flushed[key] + self._traffic[key] - self._errors[key]

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                settings.CELERY_BROKER_URL, socket_connect_timeout=0.3, socket_timeout=0.3
            )
        return self._client

    def _pipeline(self) -> Any:
        """The flush's pipeline: the lean client's for a plain ``redis://`` URL (apps/gateway/resp.py: a
        fraction of redis-py's CPU, which was half of an idle process's), else redis-py's."""
        if self._lean is None and LeanRedis.supports(settings.CELERY_BROKER_URL):
            self._lean = LeanRedis(settings.CELERY_BROKER_URL, timeout=0.3)
        if self._lean is not None:
            return self._lean.pipeline()
        return self.client.pipeline(transaction=False)

    def is_benched(self, key: str, now: float | None = None) -> bool:
        bench = self.benched.get(key)
        return bench is not None and bench.until > (now or time.time())

    def _redis_failed(self, exc: Exception) -> None:
        if self.redis_ok:
            logger.warning(
                "Redis unreachable (%s): load-balancer state continues per process until it answers",
                type(exc).__name__,
            )
        self.redis_ok = False

    def _redis_back(self) -> None:
        if not self.redis_ok:
            logger.warning("Redis reachable again: load-balancer state is shared again")
        self.redis_ok = True

    def served_quickly(self, key: str) -> bool:
        """Count a good answer; False when ``served`` must still run (a fail streak to reset). The
        gateway's hot path then skips a coroutine per request."""
        if self._local_fails.get(key):
            return False
        self._traffic[key] += 1
        return True

    async def served(self, key: str, at_capacity: bool = False) -> None:
        """A request reached the backend and was answered without a failure (``at_capacity``: a 429)."""
        self._traffic[key] += 1
        if at_capacity:
            self._busy[key] += 1
        if self._local_fails[key]:
            self._local_fails[key] = 0
            try:
                await self.client.delete(FAILS_KEY.format(key=key))
            except (redis.RedisError, OSError) as exc:
                self._redis_failed(exc)

    async def failed(
        self, key: str, name: str, reason: str, candidates: list[Any], at_capacity: bool = False
    ) -> None:
        """A request to the backend failed (5xx, connection error, timeout): count, maybe bench it.
        ``at_capacity`` (a 503): counted as the backend being full, not as an error; it still benches."""
        self._traffic[key] += 1
        if at_capacity:
            self._busy[key] += 1
        else:
            self._errors[key] += 1
        self._local_fails[key] += 1
        now = time.time()
        try:
            fails = int(await self.client.incr(FAILS_KEY.format(key=key)))
            await self.client.expire(FAILS_KEY.format(key=key), int(settings.LB_MAX_BENCH_S))
            self._redis_back()
        except (redis.RedisError, OSError) as exc:
            self._redis_failed(exc)
            fails = self._local_fails[key]
        if fails < settings.LB_CONSECUTIVE_FAILURES or self.is_benched(key, now) or key in self._benching:
            return
        # Failures arriving together (a burst to a backend just killed) each see the run at the limit
        # before the first bench is recorded: only one of them benches.
        self._benching.add(key)
        try:
            if await self._claim_bench(key):
                await self._bench(key, name, reason, now, candidates)
        finally:
            self._benching.discard(key)

    async def _claim_bench(self, key: str) -> bool:
        """True for the one process to bench ``key`` now; another that claimed it first publishes its
        bench, read here at the next flush. Without Redis each process benches on its own."""
        try:
            claimed = await self.client.set(
                BENCHING_KEY.format(key=key),
                self.process_id,
                nx=True,
                px=int(settings.LB_BASE_BENCH_S * 1000),
            )
        except (redis.RedisError, OSError) as exc:
            self._redis_failed(exc)
            return True
        return bool(claimed)

    async def _bench(self, key: str, name: str, reason: str, now: float, candidates: list[Any]) -> None:
        history = [t for t in self._local_history.get(key, []) if t > now - settings.LB_CHURN_WINDOW_S] + [
            now
        ]
        try:
            zkey = HISTORY_KEY.format(key=key)
            await self.client.zremrangebyscore(zkey, 0, now - settings.LB_CHURN_WINDOW_S)
            await self.client.zadd(zkey, {str(now): now})
            await self.client.expire(zkey, int(settings.LB_CHURN_WINDOW_S))
            count = int(await self.client.zcard(zkey))
        except (redis.RedisError, OSError) as exc:
            self._redis_failed(exc)
            count = len(history)
        self._local_history[key] = history
        duration = min(settings.LB_BASE_BENCH_S * count, settings.LB_MAX_BENCH_S)
        bench = Bench(
            now,
            now + duration,
            f"{settings.LB_CONSECUTIVE_FAILURES} consecutive failures, last: {reason}",
            count,
        )
        self.benched[key] = bench
        self._local_fails[key] = 0
        try:
            await self.client.hset(BENCH_KEY, key, json.dumps(bench.as_dict()))
            await self.client.delete(FAILS_KEY.format(key=key))
        except (redis.RedisError, OSError) as exc:
            self._redis_failed(exc)
        healthy = sum(1 for candidate in candidates if not self.is_benched(candidate.key, now))
        logger.warning(
            "benched backend %s for %.0f s (%s)%s",
            name,
            duration,
            bench.reason,
            "; no healthy backend is left: routing to benched ones rather than to none"
            if healthy <= 0
            else "",
        )
        if count >= settings.LB_CHURN_THRESHOLD:
            await sync_to_async(_raise_churn, thread_sensitive=False)(key, name, count)

    async def flush(self) -> None:
        """Once a second (``start_flushing``): push traffic counts, read the bench list back (one round
        trip)."""
        now = time.time()
        bucket = int(now // TRAFFIC_BUCKET_S)
        traffic, errors, busy = self._traffic, self._errors, self._busy
        self._traffic, self._errors, self._busy = Counter(), Counter(), Counter()
        self.outbox.add(*self.usage.take())
        for key, count in traffic.items():
            self._answered_flushed[key] += count - errors.get(key, 0)
        hits, routed = self._affinity_hits, self._affinity_routed
        self._affinity_hits, self._affinity_routed = Counter(), Counter()
        verdicts, stale_probes = self.probes.exported(), self._stale_probes
        self._stale_probes = []
        try:
            if self.outbox.batches and self._lean is not None and self._lean.ready() is None:
                # Connected first: a batch is marked as written only once it could have been.
                await self._lean.connection()
            if self.outbox.retrying:
                # Usage sent before got no answer (Redis frozen, a cut connection): sent again only once
                # Redis answers, so that a frozen Redis is not handed one more copy a second.
                async with self._pipeline() as ping:
                    ping.ping()
                    await ping.execute()
            async with self._pipeline() as pipe:
                # Usage per credential (this minute's hash), /metrics' totals, and tokens against each
                # credential's minute, day and month (apps/gateway/limits.py): once each, however often
                # sent (apps/gateway/usage.py's Outbox).
                self.outbox.write(pipe, bucket, now)
                for key, count in traffic.items():
                    pipe.hincrby(TRAFFIC_KEY.format(bucket=bucket), key, count)
                for key, count in errors.items():
                    pipe.hincrby(ERRORS_KEY.format(bucket=bucket), key, count)
                for key, count in busy.items():
                    pipe.hincrby(BUSY_KEY.format(bucket=bucket), key, count)
                pipe.expire(TRAFFIC_KEY.format(bucket=bucket), 3600)
                pipe.expire(ERRORS_KEY.format(bucket=bucket), 3600)
                if routed:
                    affinity = AFFINITY_KEY.format(bucket=bucket)
                    for key, count in routed.items():
                        pipe.hincrby(affinity, "all:" + key, count)
                    for key, count in hits.items():
                        pipe.hincrby(affinity, "hit:" + key, count)
                    pipe.expire(affinity, 3600)
                if busy:
                    pipe.expire(BUSY_KEY.format(bucket=bucket), 3600)
                # This process's in-flight counts, for least-connections across processes.
                mine = INFLIGHT_KEY.format(process=self.process_id)
                pipe.delete(mine)
                live: dict[Any, Any] = {k: v for k, v in (self.in_flight + self.reserved).items() if v > 0}
                for k, v in self.in_flight_tokens.items():
                    if v > 0:
                        live[TOKENS_FIELD + k] = v
                if live:
                    pipe.hset(mine, mapping=live)
                pipe.expire(mine, int(PROCESS_TTL_S))
                # Requests waiting in this process's admission queues, per capability (/metrics, dashboard).
                waiting: dict[Any, Any] = {k: v for k, v in self.queued.items() if v > 0}
                if waiting or self._queued_written:
                    queued = QUEUED_KEY.format(process=self.process_id)
                    pipe.delete(queued)
                    if waiting:
                        pipe.hset(queued, mapping=waiting)
                        pipe.expire(queued, int(PROCESS_TTL_S))
                    self._queued_written = bool(waiting)
                pipe.zadd(PROCESSES_KEY, {self.process_id: now})
                pipe.zremrangebyscore(PROCESSES_KEY, 0, now - PROCESS_TTL_S)
                # The probes' verdicts: this process's out, every process's back (apps/gateway/probe.py).
                if stale_probes:
                    pipe.hdel(PROBES_KEY, *stale_probes)
                if verdicts:
                    pipe.hset(PROBES_KEY, mapping=verdicts)
                    pipe.expire(PROBES_KEY, PROBES_KEEP_S)
                pipe.zrange(PROCESSES_KEY, 0, -1)
                pipe.hgetall(BENCH_KEY)
                pipe.hgetall(PROBES_KEY)
                engines = list(self.engines_wanted)
                if engines:
                    pipe.hmget(ENGINE_SIGNALS_KEY, engines)
                results = await pipe.execute()
                if engines:
                    self._take_engine_signals(engines, results.pop(), now)
                others = [p.decode() if isinstance(p, bytes) else p for p in results[-3]]
                others = [p for p in others if p != self.process_id]
                async with self._pipeline() as read:
                    for process in others:
                        read.hgetall(INFLIGHT_KEY.format(process=process))
                    counts = await read.execute() if others else []
            self._redis_back()
        except (redis.RedisError, OSError, RespError) as exc:
            self._redis_failed(exc)
            self.others_in_flight, self.others_tokens = Counter(), Counter()
            self.engine_load = {}  # not refreshed while Redis is away: not believed either
            self._affinity_hits.update(hits)  # kept for the next flush, as usage is
            self._affinity_routed.update(routed)
            self._queued_written = True  # written again once Redis answers
            # (Usage stays in the outbox until Redis has answered for it; traffic shares are not kept.)
            self.probes.alone()
            return
        self.outbox.sent()
        self._stale_probes = self.probes.take_shared(results[-1])
        benched: dict[str, Bench] = {}
        for raw_key, raw in (results[-2] or {}).items():
            data = json.loads(raw)
            if data["until"] > now:
                benched[raw_key.decode() if isinstance(raw_key, bytes) else raw_key] = Bench(**data)
        self.benched = benched
        theirs: Counter[str] = Counter()
        their_tokens: Counter[str] = Counter()
        for mapping in counts:
            for k, v in (mapping or {}).items():
                field = k.decode() if isinstance(k, bytes) else k
                if field.startswith(TOKENS_FIELD):
                    their_tokens[field[len(TOKENS_FIELD) :]] += int(v)
                else:
                    theirs[field] += int(v)
        self.others_in_flight, self.others_tokens = theirs, their_tokens
        self.processes = len(others) + 1
        if self.after_flush is not None:
            self.after_flush()

    def in_flight_estimate(self, key: str) -> int:
        """Requests in flight to ``key`` across every web process: this one's now, the others' as of
        their last flush (at most a second or two old)."""
        return self.in_flight.get(key, 0) + self.others_in_flight.get(key, 0)

    def outstanding_estimate(self, key: str) -> int:
        """Estimated tokens of work at ``key``: the requests in flight from every web process (this one's
        now, the others' as of their last flush), and the requests its engine reports running or waiting
        beyond those (its agent's last heartbeat, when fresh), at ``ENGINE_REQUEST_TOKENS`` each."""
        tokens = self.in_flight_tokens.get(key, 0) + self.others_tokens.get(key, 0)
        engine = self.engine_load.get(key)
        if engine is not None:
            unseen = engine - self.in_flight_estimate(key)
            if unseen > 0:
                tokens += unseen * ENGINE_REQUEST_TOKENS
        return tokens

    def wants_engines(self, backends: list[Any]) -> None:
        """``backends`` are routed by least_outstanding: read their engines' signals from the next flush."""
        for backend in backends:
            self.engines_wanted[backend.key] = backend.node

    def _take_engine_signals(self, keys: list[str], values: list[Any], now: float) -> None:
        """The engines' own counts (running + waiting) of ``keys``, where their node reported them
        recently; a backend of another node's report, or of none, has no engine count."""
        raw = {key: value for key, value in zip(keys, values, strict=True) if value is not None}
        fresh = fresh_signals(decode_read(raw, now), now, nodes=self.engines_wanted)
        self.engine_load = {key: s.running + s.waiting for key, s in fresh.items()}
        self.engines_wanted = {}  # asked for again by the next picks: a backend gone is not read for ever

    def routed_by_prefix(self, key: str, home: bool) -> None:
        """A request routed by prefix affinity went to ``key``; ``home``: the backend holding its prefix."""
        self._affinity_routed[key] += 1
        if home:
            self._affinity_hits[key] += 1


def _raise_churn(key: str, name: str, count: int) -> None:
    from apps.alerts.choices import Severity
    from apps.alerts.models import Alert

    Alert.objects.raise_alert(
        ALERT_SIN_BIN_CHURN,
        Severity.WARNING,
        "backend",
        key,
        name,
        f"Backend {name} was benched {count} times within {settings.LB_CHURN_WINDOW_S / 60:.0f} minutes: "
        "it keeps "
        "failing. Look at its server's log and its node; traffic goes to the other backends meanwhile.",
    )


@dataclass
class Window:
    """The last minutes as the routers flushed them: the bench list, requests, errors and capacity
    answers (429/503) per backend; ``redis_ok`` False when Redis could not be read."""

    benched: dict[str, Bench]
    traffic: Counter[str]
    errors: Counter[str]
    busy: Counter[str]
    redis_ok: bool
    # Requests routed by prefix affinity per backend, and those of them sent to their prefix's home.
    affinity_routed: Counter[str] = field(default_factory=Counter)
    affinity_hits: Counter[str] = field(default_factory=Counter)


def shape_changed(cluster: int) -> None:
    """Mark now as the start of ``cluster``'s current shape, for its card's window (``read_window``).

    The card's window is per-minute buckets summed over the routers; a backend's counts do not say which
    shape of its cluster they were served under. So the change keeps the minute it happened in and that
    minute's counts so far: the window of the cluster then starts there, less those counts, and the shares
    are of the current shape's traffic only (a 50/50 cluster re-weighted from 75/25 showed 68 % / 32 %
    while the old requests were in the window, issue 48). What a router had served but not yet flushed
    (about a second) counts as the new shape's. Best effort: Redis away, the window holds both shapes."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    bucket = int(time.time() // TRAFFIC_BUCKET_S)
    try:
        served, failed = _bucket_counts(client, bucket)
        client.set(
            SHAPE_KEY.format(cluster=cluster),
            json.dumps({"bucket": bucket, "served": served, "failed": failed}),
            ex=SHAPE_TTL_S,
        )
    except (redis.RedisError, OSError) as exc:
        logger.warning("cluster %s's shape change not marked for its card (%s)", cluster, type(exc).__name__)


def read_window(minutes: int = 5, cluster: int | None = None) -> Window:
    """For the API and dashboard: the bench list and the last ``minutes`` of traffic, errors, capacity;
    for ``cluster``, only since its membership last changed (``shape_changed``)."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    now = time.time()
    bucket = int(now // TRAFFIC_BUCKET_S)
    traffic: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    routed: Counter[str] = Counter()
    hits: Counter[str] = Counter()
    try:
        benched = {
            (k.decode() if isinstance(k, bytes) else k): Bench(**json.loads(v))
            for k, v in client.hgetall(BENCH_KEY).items()
        }
        first = bucket - minutes + 1
        shape = client.get(SHAPE_KEY.format(cluster=cluster)) if cluster is not None else None
        since = json.loads(shape) if shape else None
        if since is not None:
            first = max(first, since["bucket"])
        for b in range(first, bucket + 1):
            served, failed = _bucket_counts(client, b)
            if since is not None and b == since["bucket"]:
                # The minute of the change: what was counted before it is the old shape's. (Capacity
                # answers and affinity counts of that minute are kept whole: they name no share.)
                served.subtract(since["served"])
                failed.subtract(since["failed"])
                served, failed = +served, +failed
            traffic.update(served)
            errors.update(failed)
            for k, v in client.hgetall(BUSY_KEY.format(bucket=b)).items():
                busy[k.decode() if isinstance(k, bytes) else k] += int(v)
            for k, v in client.hgetall(AFFINITY_KEY.format(bucket=b)).items():
                kind, _, key = (k.decode() if isinstance(k, bytes) else k).partition(":")
                (hits if kind == "hit" else routed)[key] += int(v)
    except (redis.RedisError, OSError):
        return Window({}, traffic, errors, busy, False)
    return Window(
        {k: v for k, v in benched.items() if v.until > now}, traffic, errors, busy, True, routed, hits
    )


def read_queue_depths() -> dict[str, int] | None:
    """Requests waiting in the admission queues per capability, summed over the live web processes as of
    their last flush; ``None`` when Redis cannot be read."""
    return _sum_per_process(QUEUED_KEY)


def read_in_flight() -> dict[str, int] | None:
    """Requests in flight per backend, summed over the live web processes as of their last flush (what
    admission counts against a runtime profile's ``max_concurrent``); ``None`` when Redis cannot be read."""
    found = _sum_per_process(INFLIGHT_KEY)
    if found is None:
        return None
    return {k: v for k, v in found.items() if not k.startswith(TOKENS_FIELD)}


def _sum_per_process(key: str) -> dict[str, int] | None:
    """A per-process hash (``key`` with ``{process}``) summed field by field over the live processes."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    totals: Counter[str] = Counter()
    try:
        live = client.zrangebyscore(PROCESSES_KEY, time.time() - PROCESS_TTL_S, "+inf")
        with client.pipeline(transaction=False) as pipe:
            for process in live:
                named = process.decode() if isinstance(process, bytes) else process
                pipe.hgetall(key.format(process=named))
            found = pipe.execute() if live else []
    except (redis.RedisError, OSError):
        return None
    for mapping in found:
        for k, v in (mapping or {}).items():
            totals[k.decode() if isinstance(k, bytes) else k] += int(v)
    return dict(totals)


def read_bench_and_traffic(minutes: int = 5) -> tuple[dict[str, Bench], Counter[str], Counter[str], bool]:
    """The bench list and the last ``minutes`` of traffic and errors (``read_window`` without capacity)."""
    window = read_window(minutes)
    return window.benched, window.traffic, window.errors, window.redis_ok


shared = SharedState()


def _named_after_fork() -> None:
    # gunicorn forks its web workers from a master that imported this module: each names itself by its own
    # pid, or every worker wrote its in-flight counts under the master's name and took none of the others'.
    shared.process_id = f"{socket.gethostname()}:{os.getpid()}"
    shared.outbox = Outbox()


os.register_at_fork(after_in_child=_named_after_fork)


def clear_settled_churn() -> int:
    """Clear ``lb_sin_bin_churn`` for backends no longer benched often (fewer than the threshold within
    the window). Runs from beat; returns how many alerts were cleared."""
    from apps.alerts.models import Alert

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    now = time.time()
    settled = []
    for alert in Alert.objects.open().filter(code=ALERT_SIN_BIN_CHURN):
        try:
            recent = client.zcount(
                HISTORY_KEY.format(key=alert.subject_id), now - settings.LB_CHURN_WINDOW_S, now
            )
        except (redis.RedisError, OSError):
            return 0  # no verdict without the history: leave them open
        if int(recent) < settings.LB_CHURN_THRESHOLD:
            settled.append(alert.dedup_key)
    return Alert.objects.clear(settled)


def read_traffic_minutes(minutes: int) -> dict[int, tuple[Counter[str], Counter[str]]] | None:
    """The last ``minutes`` complete one-minute buckets (not the current one): bucket number →
    (requests, errors) per backend. ``None`` when Redis cannot be read."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    current = int(time.time() // TRAFFIC_BUCKET_S)
    try:
        counted = {bucket: _bucket_counts(client, bucket) for bucket in range(current - minutes, current)}
    except (redis.RedisError, OSError):
        return None
    return {bucket: counts for bucket, counts in counted.items() if counts[0] or counts[1]}


def _bucket_counts(client: redis.Redis, bucket: int) -> tuple[Counter[str], Counter[str]]:
    """One minute's (requests, errors) per backend, as the routers flushed them."""
    traffic: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for counter, key in ((traffic, TRAFFIC_KEY), (errors, ERRORS_KEY)):
        for k, v in client.hgetall(key.format(bucket=bucket)).items():
            counter[k.decode() if isinstance(k, bytes) else k] += int(v)
    return traffic, errors
