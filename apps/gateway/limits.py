"""Limits per client credential, held across every gateway process through Redis.

A credential may carry requests per minute, tokens per minute, concurrent requests, and a token budget
per day and per month (UTC). A call of a credential with any limit costs one Redis round trip before it
is forwarded: one Lua script checks them all and admits the call or names the limit it would break. A
credential without limits costs nothing.

- **Requests per minute**: a sliding window (a sorted set of the last minute's admissions), so 60 a
  minute means at most 60 in any 60 seconds, across every process.
- **Tokens per minute, per day, per month**: the engines' own counts (apps/gateway/usage.py), added by
  each process's flush once a second to the current minute's, day's and month's totals; a call is
  admitted while the total is under the limit. Tokens are known only once an answer is complete, so
  calls already admitted can take a total past its limit; none is admitted after.
- **Concurrent requests**: a sorted set of the calls in flight, each removed when its answer ends (sent
  with the process's next admission, within ``RELEASE_WITHIN_S``; forgotten after ``IN_FLIGHT_TTL_S`` if
  its process died holding it).

A refusal is ``429`` with ``Retry-After``: ``RATE_LIMITED`` for the per-minute and concurrency limits,
``BUDGET_EXHAUSTED`` for the day and month budgets. With Redis unreachable, limits cannot be checked
and calls are admitted (logged once per outage): a limit is a control on cost and fairness, and a Redis
blip must not become an outage of every limited credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import math
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
import redis.asyncio as aioredis

from apps.clusters import codes
from apps.clusters.limits import IN_FLIGHT_TTL_S, KEY, keys
from apps.gateway.resp import LeanRedis, RespError

logger = logging.getLogger("modelforge.gateway")


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None

    def any(self) -> bool:
        return any(
            v is not None
            for v in (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.max_concurrent,
                self.tokens_per_day,
                self.tokens_per_month,
            )
        )


# KEYS: requests zset, in-flight zset, tokens this minute, tokens today, tokens this month.
# ARGV: now (ms), call id, rpm, tpm, concurrent, day, month (-1: no limit), in-flight TTL (ms), seconds to
# the next minute, day and month.
# Returns {0} (admitted) or {1 = budget | 2 = rate, retry after (ms), which limit}.
ADMIT = """
local now = tonumber(ARGV[1])
local rpm, tpm, conc = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local day, month = tonumber(ARGV[6]), tonumber(ARGV[7])
if month >= 0 and tonumber(redis.call('GET', KEYS[5]) or '0') >= month then
  return {1, tonumber(ARGV[11]) * 1000, 'tokens_per_month'}
end
if day >= 0 and tonumber(redis.call('GET', KEYS[4]) or '0') >= day then
  return {1, tonumber(ARGV[10]) * 1000, 'tokens_per_day'}
end
if tpm >= 0 and tonumber(redis.call('GET', KEYS[3]) or '0') >= tpm then
  return {2, tonumber(ARGV[9]) * 1000, 'tokens_per_minute'}
end
if rpm >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
  if redis.call('ZCARD', KEYS[1]) >= rpm then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {2, tonumber(oldest[2]) + 60000 - now, 'requests_per_minute'}
  end
end
if conc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[8]))
  if redis.call('ZCARD', KEYS[2]) >= conc then
    return {2, 1000, 'max_concurrent'}
  end
  redis.call('ZADD', KEYS[2], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[8]))
end
if rpm >= 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], 61000)
end
return {0}
"""

# Redis names a script by its SHA-1 (EVALSHA): an identifier, not a security measure.
ADMIT_SHA = hashlib.sha1(ADMIT.encode(), usedforsecurity=False).hexdigest()

MESSAGES = {
    "requests_per_minute": "The credential's limit of {limit} requests per minute is reached.",
    "tokens_per_minute": "The credential's limit of {limit} tokens per minute is reached.",
    "max_concurrent": "The credential's limit of {limit} concurrent requests is reached.",
    "tokens_per_day": "The credential's budget of {limit} tokens a day (UTC) is used up.",
    "tokens_per_month": "The credential's budget of {limit} tokens a month (UTC) is used up.",
}


class LimitReached(Exception):
    def __init__(self, code: str, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after_s = code, message, retry_after_s


def seconds_to_boundaries(now: float) -> tuple[int, int, int]:
    """Seconds to the next minute, UTC day and UTC month."""
    moment = datetime.fromtimestamp(now, tz=UTC)
    minute = 60 - int(now % 60)
    day = 86400 - (moment.hour * 3600 + moment.minute * 60 + moment.second)
    next_month = datetime(moment.year + (moment.month == 12), moment.month % 12 + 1, 1, tzinfo=UTC)
    return minute, day, max(1, math.ceil(next_month.timestamp() - now))


# A call's id (a member of the credential's sorted sets): this process's random prefix and a counter,
# unique across processes without a system call (uuid4 reads the kernel's random source every time).
_CALL_PREFIX = f"{os.getpid():x}.{secrets.token_hex(6)}."


# A released slot's ZREM waits this long for an admission to leave with (one system call for both).
RELEASE_WITHIN_S = 0.002


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class Limiter:
    """One per web process: the admission script, and the release of concurrency slots.

    A call's ``EVALSHA`` is assembled from parts encoded once: per credential and minute its keys, per
    set of limits their arguments, per second the seconds to the next minute, day and month; only the
    time and the call's id are encoded per call."""

    def __init__(self) -> None:
        self._client: aioredis.Redis | None = None
        self._lean: LeanRedis | None = None
        self._script: object = None
        self._background: set[asyncio.Future[Any]] = set()
        self.redis_ok = True
        self._calls = itertools.count()
        self._minute = -1  # the minute the caches below were made in (cleared when it turns)
        self._heads: dict[str, bytes] = {}  # credential: EVALSHA, its digest and its five keys, encoded
        self._limit_args: dict[Limits, bytes] = {}
        self._second = -1
        self._boundaries = b""
        self._releases: dict[str, bytes] = {}  # credential: ZREM and its in-flight key, encoded

    def lean(self) -> LeanRedis | None:
        """The lean client (apps/gateway/resp.py) for a plain ``redis://`` URL; None: use redis-py."""
        if self._lean is None:
            from django.conf import settings

            if not LeanRedis.supports(settings.CELERY_BROKER_URL):
                return None
            self._lean = LeanRedis(settings.CELERY_BROKER_URL)
        return self._lean

    def client(self) -> aioredis.Redis:
        if self._client is None:
            from django.conf import settings

            self._client = aioredis.Redis.from_url(
                settings.CELERY_BROKER_URL, socket_connect_timeout=0.3, socket_timeout=0.5
            )
        return self._client

    def _evalsha(self, credential: str, limits: Limits, now: float, call: str) -> bytes:
        """The encoded ``EVALSHA`` of ``ADMIT`` for one call (its arguments as documented above it)."""
        second = int(now)
        if second != self._second:
            self._second = second
            minute_n = second // 60
            if minute_n != self._minute:
                self._minute = minute_n
                self._heads.clear()
                self._limit_args.clear()
            self._boundaries = b"".join(_bulk(b"%d" % s) for s in seconds_to_boundaries(now))
        head = self._heads.get(credential)
        if head is None:
            head = self._heads[credential] = b"*19\r\n$7\r\nEVALSHA\r\n" + b"".join(
                _bulk(part.encode()) for part in (ADMIT_SHA, "5", *keys(credential, self._minute * 60))
            )
        limit_args = self._limit_args.get(limits)
        if limit_args is None:
            limit_args = self._limit_args[limits] = b"".join(
                _bulk(b"%d" % (-1 if v is None else v))
                for v in (
                    limits.requests_per_minute,
                    limits.tokens_per_minute,
                    limits.max_concurrent,
                    limits.tokens_per_day,
                    limits.tokens_per_month,
                    IN_FLIGHT_TTL_S * 1000,
                )
            )
        return head + _bulk(b"%d" % int(now * 1000)) + _bulk(call.encode()) + limit_args + self._boundaries

    async def admit(self, credential: str, limits: Limits) -> str | None:
        """Admit one call (returns its id, to release) or raise ``LimitReached``."""
        now = time.time()
        call = _CALL_PREFIX + str(next(self._calls))
        try:
            lean = self.lean()
            if lean is not None:
                answer = await lean.run_script(self._evalsha(credential, limits, now, call), ADMIT)
            else:
                if self._script is None:
                    self._script = self.client().register_script(ADMIT)
                answer = await self._script(keys=keys(credential, now), args=_argv(limits, now, call))  # type: ignore[operator]
        except (redis.RedisError, OSError, RespError) as exc:
            if self.redis_ok:
                logger.warning(
                    "Redis unreachable (%s): credential limits are not enforced until it answers",
                    type(exc).__name__,
                )
            self.redis_ok = False
            return None
        if not self.redis_ok:
            logger.warning("Redis reachable again: credential limits are enforced")
            self.redis_ok = True
        if answer[0] == 0:
            return call if limits.max_concurrent is not None else None
        which = answer[2].decode() if isinstance(answer[2], bytes) else str(answer[2])
        limit = getattr(limits, which)
        code = codes.BUDGET_EXHAUSTED if int(answer[0]) == 1 else codes.RATE_LIMITED
        raise LimitReached(
            code, MESSAGES[which].format(limit=limit), max(1, math.ceil(int(answer[1]) / 1000))
        )

    def release(self, credential: str, call: str) -> None:
        """Give a call's concurrency slot back. Sent, not awaited: it leaves on the one connection with
        the next admission this process sends, or alone ``RELEASE_WITHIN_S`` after the answer ended,
        whichever is first, so this process's next admission is always checked after it. Held that
        moment longer, a slot can only refuse a call, never admit one too many. If it is lost (Redis
        away), the slot is forgotten after ``IN_FLIGHT_TTL_S``."""
        lean = self.lean()
        if lean is not None:
            head = self._releases.get(credential)
            if head is None:
                if len(self._releases) > 10_000:
                    self._releases.clear()
                in_flight = KEY.format(credential=credential, what="in-flight").encode()
                head = self._releases[credential] = b"*3\r\n$4\r\nZREM\r\n" + _bulk(in_flight)
            lean.fire(head + _bulk(call.encode()), RELEASE_WITHIN_S)
            return
        task = asyncio.ensure_future(self._release_with_redis_py(credential, call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release_with_redis_py(self, credential: str, call: str) -> None:
        with contextlib.suppress(redis.RedisError, OSError):  # else forgotten after IN_FLIGHT_TTL_S
            await self.client().zrem(KEY.format(credential=credential, what="in-flight"), call)


def _argv(limits: Limits, now: float, call: str) -> list[Any]:
    """``ADMIT``'s arguments, for redis-py."""
    return [
        int(now * 1000),
        call,
        *(
            -1 if v is None else v
            for v in (
                limits.requests_per_minute,
                limits.tokens_per_minute,
                limits.max_concurrent,
                limits.tokens_per_day,
                limits.tokens_per_month,
            )
        ),
        IN_FLIGHT_TTL_S * 1000,
        *seconds_to_boundaries(now),
    ]


def add_tokens(pipe: object, credential: str, tokens: int, now: float) -> None:
    """Count ``tokens`` against the credential's minute, day and month (the flush's pipeline)."""
    for key, ttl in zip(keys(credential, now)[2:], (120, 2 * 86400, 32 * 86400), strict=True):
        pipe.incrby(key, tokens)  # type: ignore[attr-defined]
        pipe.expire(key, ttl)  # type: ignore[attr-defined]


limiter = Limiter()
