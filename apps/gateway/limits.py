"""Limits per client credential, held across every gateway process through Redis.

A credential may carry requests per minute, tokens per minute, concurrent requests, and a token budget
per day and per month (UTC). A call of a credential with any limit costs one Redis round trip before it
is forwarded: one Lua script checks them all and admits the call or names the limit it would break. A
credential without limits costs nothing. A busy credential far from every limit is granted credit: calls
admitted ahead, counted in Redis from the grant, handed out by this process without a round trip
(``Credit``; never near a limit, so decisions there stay exact).

- **Requests per minute**: a sliding window (a sorted set of the last minute's admissions), so 60 a
  minute means at most 60 in any 60 seconds, across every process.
- **Tokens per minute, per day, per month**: the engines' own counts (apps/gateway/usage.py), added by
  each process's flush once a second to the current minute's, day's and month's totals; a call is
  admitted while the total is under the limit. Tokens are known only once an answer is complete, so
  calls already admitted can take a total past its limit; none is admitted after.
- **Concurrent requests**: a sorted set of the calls in flight, each removed when its answer ends (with
  the process's next admission of that credential, or alone within ``RELEASE_WITHIN_S``; forgotten after
  ``IN_FLIGHT_TTL_S`` if its process died holding it).

A refusal is ``429`` with ``Retry-After``: ``RATE_LIMITED`` for the per-minute and concurrency limits,
``BUDGET_EXHAUSTED`` for the day and month budgets. With Redis unreachable, limits cannot be checked
and calls are admitted (logged once per outage): a limit is a control on cost and fairness, and a Redis
blip must not become an outage of every limited credential. Unreachable is no connection to be made, or
no reply within ``resp.TIMEOUT_S``; a process not connected yet connects first, a connection that ended
under a call (a restart) is made again for it, and a Redis that lost the script gets it loaded: each
checks the call rather than admitting it unchecked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
import redis.asyncio as aioredis

from apps.clusters import codes
from apps.clusters.limits import IN_FLIGHT_TTL_S, KEY, keys
from apps.gateway.resp import LeanRedis, RespConnectionLost, RespError

logger = logging.getLogger("modelforge.gateway")


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    # Its hash, made once: a limited call looks its credit up by (credential, limits), and a dataclass's
    # own __hash__ builds and hashes a tuple of the fields in Python at every look-up.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        fields = (
            self.requests_per_minute,
            self.tokens_per_minute,
            self.max_concurrent,
            self.tokens_per_day,
            self.tokens_per_month,
        )
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

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
# ARGV: now (ms), rpm, tpm, concurrent, day, month (-1: no limit), in-flight TTL (ms), seconds to the next
# minute, day and month, tidy (1: trim stale entries and renew expiries), want (credit asked for, 0: none),
# n, u, then the ids of the n calls to admit (in order), then u ids of credit never used (given back from
# both sets), then the ids of calls of this credential whose slots are given back (this process's releases
# not sent yet); both go first.
# Returns {0} (every call admitted, the usual), {0, g} (every call admitted, and g more admitted ahead as
# credit: ids "<last call's id>+1" .. "+g"), or, per call in order, three values: 0 (admitted) | 1
# (budget) | 2 (rate), retry after (ms), which limit.
#
# Credit (``Credit``) is granted only far from every limit: at least CREDIT_MIN_ROOM below each per-call
# limit and at most 1/CREDIT_SHARE of what is left, a quarter or more of each token limit left. Near a
# limit none is granted, so every call is judged by the script itself and the decision stays exact.
#
# A set's size counts its stale entries too until they are trimmed, so below the limit it is an upper
# bound of the live count and the call is admitted without trimming; at the limit the set is trimmed and
# counted again, so the decision is exact. Trimming (and renewing the expiries) runs once a second per
# credential and process ("tidy"), and when a set is made: it holds about a minute, and every key expires.
# The n calls are judged one after the other, each counting the ones admitted before it.
ADMIT = """
local now = tonumber(ARGV[1])
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local day, month, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local tidy = ARGV[11] == '1'
local want, n, u = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local first = 15 + n
if #ARGV >= first then
  redis.call('ZREM', KEYS[2], unpack(ARGV, first))
  if u > 0 then
    redis.call('ZREM', KEYS[1], unpack(ARGV, first, first + u - 1))
  end
end
local function all(code, retry, which)
  local out = {}
  for i = 1, n do
    out[#out + 1] = code
    out[#out + 1] = retry
    out[#out + 1] = which
  end
  return out
end
local used = nil
if month >= 0 or day >= 0 or tpm >= 0 then
  used = redis.call('MGET', KEYS[3], KEYS[4], KEYS[5])
  if month >= 0 and tonumber(used[3] or '0') >= month then
    return all(1, tonumber(ARGV[10]) * 1000, 'tokens_per_month')
  end
  if day >= 0 and tonumber(used[2] or '0') >= day then
    return all(1, tonumber(ARGV[9]) * 1000, 'tokens_per_day')
  end
  if tpm >= 0 and tonumber(used[1] or '0') >= tpm then
    return all(2, tonumber(ARGV[8]) * 1000, 'tokens_per_minute')
  end
end
local window, flying, trimmed_w, trimmed_f = 0, 0, tidy, tidy
if rpm >= 0 then
  if tidy then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
  end
  window = redis.call('ZCARD', KEYS[1])
end
if conc >= 0 then
  if tidy then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
  end
  flying = redis.call('ZCARD', KEYS[2])
end
local new_w, new_f = window == 0, flying == 0
local out, requests, slots, refused = {}, {}, {}, false
for i = 1, n do
  local code, retry, which = 0, 0, ''
  if rpm >= 0 and window >= rpm and not trimmed_w then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
    window, trimmed_w = redis.call('ZCARD', KEYS[1]) + #requests / 2, true
  end
  if rpm >= 0 and window >= rpm then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    code, which = 2, 'requests_per_minute'
    retry = oldest[2] and (tonumber(oldest[2]) + 60000 - now) or 60000
  else
    if conc >= 0 and flying >= conc and not trimmed_f then
      redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
      flying, trimmed_f = redis.call('ZCARD', KEYS[2]) + #slots / 2, true
    end
    if conc >= 0 and flying >= conc then
      code, retry, which = 2, 1000, 'max_concurrent'
    end
  end
  if code == 0 then
    window, flying = window + 1, flying + 1
    if rpm >= 0 then
      requests[#requests + 1] = now
      requests[#requests + 1] = ARGV[14 + i]
    end
    if conc >= 0 then
      slots[#slots + 1] = now
      slots[#slots + 1] = ARGV[14 + i]
    end
  else
    refused = true
  end
  out[#out + 1] = code
  out[#out + 1] = retry
  out[#out + 1] = which
end
local granted = 0
if want > 0 and not refused then
  granted = want
  local function room(limit, count)
    if limit >= 0 and granted > 0 then
      local left = limit - count
      granted = left >= CREDIT_MIN_ROOM and math.min(granted, math.floor(left / CREDIT_SHARE)) or 0
    end
  end
  room(rpm, window)
  room(conc, flying)
  if used ~= nil then
    for i, limit in ipairs({tpm, day, month}) do
      if limit >= 0 and limit - tonumber(used[i] or '0') < limit / 4 then
        granted = 0
      end
    end
  end
  local base = ARGV[14 + n] .. '+'
  for j = 1, granted do
    if rpm >= 0 then
      requests[#requests + 1] = now + CREDIT_TTL_MS
      requests[#requests + 1] = base .. j
    end
    if conc >= 0 then
      slots[#slots + 1] = now
      slots[#slots + 1] = base .. j
    end
  end
end
if #slots > 0 then
  redis.call('ZADD', KEYS[2], unpack(slots))
  if trimmed_f or new_f then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
if #requests > 0 then
  redis.call('ZADD', KEYS[1], unpack(requests))
  if trimmed_w or new_w then
    redis.call('PEXPIRE', KEYS[1], 61000)
  end
end
if refused then
  return out
end
if granted > 0 then
  return {0, granted}
end
return {0}
"""

# Credit: a busy process's calls of a credential are admitted ahead, a few dozen at a time, when far from
# every limit: the admitted-ahead calls are in the sets (counted by every process) from the moment they
# are granted, and the process hands them out without a round trip; what it has not used within
# CREDIT_TTL_S goes back. Far means at least CREDIT_MIN_ROOM below each per-call limit; a grant takes at
# most 1/CREDIT_SHARE of what is left, and at most what the process used in the last CREDIT_TTL_S (its
# want, never more than CREDIT_MAX; under CREDIT_MIN_WANT: none asked).
CREDIT_MIN_ROOM = 1000
CREDIT_SHARE = 64
CREDIT_MAX = 32
CREDIT_MIN_WANT = 4
CREDIT_TTL_S = 0.25
for _name, _value in (
    ("CREDIT_MIN_ROOM", CREDIT_MIN_ROOM),
    ("CREDIT_SHARE", CREDIT_SHARE),
    ("CREDIT_TTL_MS", int(CREDIT_TTL_S * 1000)),
):
    ADMIT = ADMIT.replace(_name, str(_value))

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
def _call_prefix() -> str:
    return f"{os.getpid():x}.{secrets.token_hex(6)}."


_CALL_PREFIX = _call_prefix()


def _new_call_prefix() -> None:
    # gunicorn's master imports this module (Django's set-up, for the start-up checks) and forks every web
    # worker from it: a prefix drawn at import was every worker's, so two workers' first calls had the same
    # ids, one ZADD replaced the other's entry, and a credential's first calls after a start went past its
    # limits (issue 47: 5 of 8 admitted at 3 a minute, two workers). Each process draws its own.
    global _CALL_PREFIX
    _CALL_PREFIX = _call_prefix()


os.register_at_fork(after_in_child=_new_call_prefix)


# Calls of one credential admitted in one turn of the event loop go in one script call, up to this many.
MAX_BATCH = 64

# A released slot waits this long for its credential's next admission to go with (one script call for
# both); then the slots waiting leave in one ZREM per credential.
RELEASE_WITHIN_S = 0.002


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class _Batch:
    """The calls of one credential (and set of limits) to admit in one script call: those that arrive in
    the same turn of the event loop, sent as it ends (``_Protocol.send_built``)."""

    __slots__ = ("calls", "credential", "limits", "released", "sealed_at", "unused", "waiter")

    def __init__(self, credential: str, limits: Limits, waiter: asyncio.Future[Any]) -> None:
        self.credential, self.limits, self.waiter = credential, limits, waiter
        self.calls: list[str] = []
        self.released: list[bytes] | None = None  # the slots it gives back first
        self.unused: list[bytes] | None = None  # credit never used, given back first
        self.sealed_at = 0.0  # (monotonic) when its command was made: the time its credit is granted at


class Credit:
    """One credential's (and set of limits') calls admitted ahead in this process: ``ids`` to hand out
    until ``until`` (monotonic), and how many calls came in the current and the last CREDIT_TTL_S."""

    __slots__ = ("asking", "ids", "last", "period", "seen", "until")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.asking: _Batch | None = None  # the batch whose script call asks for credit, until it answers
        self.until = 0.0
        self.period = -1
        self.seen = self.last = 0

    def count(self, now: float) -> None:
        period = int(now / CREDIT_TTL_S)
        if period != self.period:
            self.last = self.seen if period == self.period + 1 else 0
            self.period, self.seen = period, 0
        self.seen += 1

    def want(self) -> int:
        """Credit worth asking for: what the last CREDIT_TTL_S used (none while some is left or asked)."""
        if self.ids or self.asking is not None or self.last < CREDIT_MIN_WANT:
            return 0
        return min(self.last, CREDIT_MAX)


class Limiter:
    """One per web process: the admission script, and the release of concurrency slots.

    A script call's ``EVALSHA`` is assembled from parts encoded once: per credential and minute its keys,
    per set of limits their arguments, per second the seconds to the next minute, day and month; only the
    time and the calls' ids are encoded per call (and the released slots it carries). The calls of one
    credential that arrive in the same turn of the event loop share one script call (``_Batch``): a busy
    gateway runs the script a third as often (bench/gateway, 2026-12-02), and each call is still judged
    on its own, in order."""

    def __init__(self) -> None:
        self._client: aioredis.Redis | None = None
        self._lean: LeanRedis | None = None
        self._script: object = None
        self._background: set[asyncio.Future[Any]] = set()
        self.redis_ok = True
        self._calls = itertools.count()
        self._minute = -1  # the minute the caches below were made in (cleared when it turns)
        self._heads: dict[str, bytes] = {}  # credential: EVALSHA's digest and its five keys, encoded
        self._tidied: dict[str, int] = {}  # credential: the second its last tidying call was sent in
        self._limit_args: dict[Limits, bytes] = {}
        self._second = -1
        self._boundaries = b""
        self._releases: dict[str, bytes] = {}  # credential: ZREM and its in-flight key, encoded
        self._released: dict[str, list[bytes]] = {}  # credential: its slots given back, not sent yet
        self._releasing: asyncio.TimerHandle | None = None  # the moment they leave without an admission
        self._open: dict[tuple[str, Limits], _Batch] = {}  # batches of this turn, not sent yet
        self._credit: dict[tuple[str, Limits], Credit] = {}
        self._unused: dict[str, list[bytes]] = {}  # credential: credit given back, not sent yet
        self._requests: dict[str, bytes] = {}  # credential: ZREM and its requests key, encoded

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

    def _evalsha(
        self,
        credential: str,
        limits: Limits,
        now: float,
        calls: list[str],
        released: list[bytes] | None = None,
        unused: list[bytes] | None = None,
        want: int = 0,
    ) -> bytes:
        """The encoded ``EVALSHA`` of ``ADMIT`` for ``calls`` (its arguments as documented above it),
        ``released``: encoded ids of this credential's slots to give back first, ``unused``: of its credit
        never used; ``want``: the credit asked for."""
        second = int(now)
        if second != self._second:
            self._second = second
            minute_n = second // 60
            if minute_n != self._minute:
                self._minute = minute_n
                self._heads.clear()
                self._limit_args.clear()
                self._tidied.clear()
            self._boundaries = b"".join(_bulk(b"%d" % s) for s in seconds_to_boundaries(now))
        head = self._heads.get(credential)
        if head is None:
            head = self._heads[credential] = b"$7\r\nEVALSHA\r\n" + b"".join(
                _bulk(part.encode()) for part in (ADMIT_SHA, "5", *keys(credential, self._minute * 60))
            )
        if self._tidied.get(credential) != second:
            self._tidied[credential] = second
            tidy = b"$1\r\n1\r\n"
        else:
            tidy = b"$1\r\n0\r\n"
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
        extra = (len(released) if released else 0) + (len(unused) if unused else 0)
        count = b"*%d\r\n" % (22 + len(calls) + extra)
        command = count + head + _bulk(b"%d" % int(now * 1000)) + limit_args + self._boundaries + tidy
        command += _bulk(b"%d" % want) + _bulk(b"%d" % len(calls))
        command += _bulk(b"%d" % (len(unused) if unused else 0))
        command += b"".join(_bulk(call.encode()) for call in calls)
        if unused:
            command += b"".join(unused)
        return command + b"".join(released) if released else command

    def _seal(self, batch: _Batch) -> bytes:
        """``batch``'s command, made as it leaves (the end of the turn its first call came in); from then
        on the turn's calls start another."""
        if self._open.get((batch.credential, batch.limits)) is batch:
            del self._open[(batch.credential, batch.limits)]
        released = batch.released = self._released.pop(batch.credential, None)
        unused = batch.unused = self._unused.pop(batch.credential, None)
        batch.sealed_at = time.monotonic()
        credit = self._credit.get((batch.credential, batch.limits))
        want = credit.want() if credit is not None else 0
        if credit is not None and want:
            credit.asking = batch
        return self._evalsha(batch.credential, batch.limits, time.time(), batch.calls, released, unused, want)

    async def _admit_lean(self, lean: LeanRedis, credential: str, limits: Limits, call: str) -> Any:
        """This call's three values (or ``[0]``: admitted), from the script call of its turn's batch."""
        protocol = lean.ready() or await lean._connection()
        key = (credential, limits)
        batch = self._open.get(key)
        # A batch still open was not sent yet, unless its connection was lost first (its waiter failed).
        if batch is None or batch.waiter.done() or len(batch.calls) >= MAX_BATCH:
            batch = self._open[key] = _Batch(credential, limits, protocol.loop.create_future())
            protocol.send_built(functools.partial(self._seal, batch), batch.waiter)
        index = len(batch.calls)
        batch.calls.append(call)
        try:
            answer = await batch.waiter
        except RespConnectionLost:
            if index == 0:  # tried again (``admit``): the slots and credit it gave back go with it
                self._requeue(credential, batch)
            raise
        finally:
            credit = self._credit.get(key)
            if index == 0 and credit is not None and credit.asking is batch:
                credit.asking = None
        if isinstance(answer, RespError) and str(answer).startswith("NOSCRIPT"):
            # Redis lost its scripts (a restart): this call alone, the script loaded first; the slots the
            # batch was to give back go with the first call's.
            if index == 0:
                self._requeue(credential, batch)
            return await lean.run_script(self._evalsha(credential, limits, time.time(), [call]), ADMIT)
        if isinstance(answer, RespError):
            raise answer
        if len(answer) <= 2:
            if index == 0 and len(answer) == 2:
                self._granted(key, batch, int(answer[1]))
            return answer
        return answer[3 * index : 3 * index + 3]

    def _requeue(self, credential: str, batch: _Batch) -> None:
        """The slots and credit a batch was to give back, for the credential's next script call."""
        if batch.released:
            self._released.setdefault(credential, []).extend(batch.released)
        if batch.unused:
            self._unused.setdefault(credential, []).extend(batch.unused)

    def _granted(self, key: tuple[str, Limits], batch: _Batch, granted: int) -> None:
        """Credit came with ``batch``'s answer: ``granted`` calls admitted ahead, handed out by ``admit``
        until CREDIT_TTL_S is up, the rest then given back."""
        credit = self._credit.get(key)
        if credit is None or granted <= 0:
            return  # (a process that forgot its credit: the grant expires with the sets' entries)
        base = batch.calls[-1] + "+"
        ids = [base + str(j) for j in range(granted, 0, -1)]  # handed out from the end: +1 first
        if credit.ids:  # (``asking`` lets one batch ask at a time; should two grants meet, one goes back)
            self._give_back(key[0], ids)
            return
        credit.ids = ids
        credit.until = batch.sealed_at + CREDIT_TTL_S
        delay = max(0.0, credit.until - time.monotonic())
        asyncio.get_running_loop().call_later(delay, self._expire, key, credit, credit.ids)

    def _expire(self, key: tuple[str, Limits], credit: Credit, ids: list[str]) -> None:
        """CREDIT_TTL_S after a grant: what is left of it goes back, with the credential's next admission
        or alone within RELEASE_WITHIN_S."""
        if credit.ids is not ids or not ids:
            return  # used up (and maybe granted again since)
        credit.ids = []
        self._give_back(key[0], ids)

    def _give_back(self, credential: str, ids: list[str]) -> None:
        waiting = self._unused.setdefault(credential, [])
        waiting.extend(_bulk(call.encode()) for call in ids)
        if self._releasing is None:
            self._releasing = asyncio.get_running_loop().call_later(RELEASE_WITHIN_S, self._send_releases)

    async def admit(self, credential: str, limits: Limits) -> str | None:
        """Admit one call (returns its id, to release) or raise ``LimitReached``."""
        try:
            lean = self.lean()
            if lean is not None:
                key = (credential, limits)
                credit = self._credit.get(key)
                if credit is None:
                    if len(self._credit) > 10_000:
                        self._credit.clear()  # credentials come and go; credit outlives no grant anyway
                    credit = self._credit[key] = Credit()
                now = time.monotonic()
                credit.count(now)
                if not credit.ids and credit.asking is not None:
                    # Credit is on its way: wait for it rather than make a script call of our own
                    # (shielded: this call cancelled must not cancel the answer the asking calls await).
                    with contextlib.suppress(Exception):
                        await asyncio.shield(credit.asking.waiter)
                    now = time.monotonic()
                if credit.ids:
                    if now < credit.until:
                        call = credit.ids.pop()
                        return call if limits.max_concurrent is not None else None
                    unused, credit.ids = credit.ids, []
                    self._give_back(credential, unused)
                call = _CALL_PREFIX + str(next(self._calls))
                try:
                    answer = await self._admit_lean(lean, credential, limits, call)
                except RespConnectionLost:
                    # The connection ended under the call (Redis restarted a moment ago): a new one is
                    # made and the call checked on it; only when that fails too is Redis unreachable.
                    # (The same id: a call that Redis counted before the connection ended is not counted
                    # twice.)
                    answer = await self._admit_lean(lean, credential, limits, call)
            else:
                call = _CALL_PREFIX + str(next(self._calls))
                now = time.time()
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
        """Give a call's concurrency slot back. Sent, not awaited: it goes with this process's next
        admission of the same credential (the script gives it back before it counts), or, if none comes
        within ``RELEASE_WITHIN_S``, in one ``ZREM`` with the credential's other slots waiting. So this
        process's next admission of the credential is always checked after it. Held that moment longer,
        a slot can only refuse a call, never admit one too many. If it is lost (Redis away), the slot is
        forgotten after ``IN_FLIGHT_TTL_S``."""
        if self.lean() is not None:
            waiting = self._released.get(credential)
            if waiting is None:
                self._released[credential] = [_bulk(call.encode())]
            else:
                waiting.append(_bulk(call.encode()))
            if self._releasing is None:
                loop = asyncio.get_running_loop()
                self._releasing = loop.call_later(RELEASE_WITHIN_S, self._send_releases)
            return
        task = asyncio.ensure_future(self._release_with_redis_py(credential, call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _send_releases(self) -> None:
        """The slots no admission took along: one ``ZREM`` per credential, at the end of this turn."""
        self._releasing = None
        lean, released, unused = self.lean(), self._released, self._unused
        self._released, self._unused = {}, {}
        if lean is None:
            return
        if len(self._releases) > 10_000:
            self._releases.clear()
            self._requests.clear()
        for credential in released.keys() | unused.keys():
            calls = released.get(credential, []) + unused.get(credential, [])
            head = self._releases.get(credential)
            if head is None:
                in_flight = KEY.format(credential=credential, what="in-flight").encode()
                head = self._releases[credential] = b"$4\r\nZREM\r\n" + _bulk(in_flight)
            lean.fire(b"*%d\r\n" % (2 + len(calls)) + head + b"".join(calls))
            if credential in unused:
                head = self._requests.get(credential)
                if head is None:
                    requests = KEY.format(credential=credential, what="requests").encode()
                    head = self._requests[credential] = b"$4\r\nZREM\r\n" + _bulk(requests)
                lean.fire(b"*%d\r\n" % (2 + len(unused[credential])) + head + b"".join(unused[credential]))

    async def _release_with_redis_py(self, credential: str, call: str) -> None:
        with contextlib.suppress(redis.RedisError, OSError):  # else forgotten after IN_FLIGHT_TTL_S
            await self.client().zrem(KEY.format(credential=credential, what="in-flight"), call)


def _argv(limits: Limits, now: float, call: str) -> list[Any]:
    """``ADMIT``'s arguments, for redis-py."""
    return [
        int(now * 1000),
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
        1,  # tidy: every call (redis-py is the fallback for URLs the lean client does not take)
        0,  # no credit
        1,
        0,
        call,
    ]


limiter = Limiter()
