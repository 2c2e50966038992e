"""Usage per credential, project, capability and backend: requests, errors, tokens, time to first token
and total time, counted in memory per web process and written without a database write per request.

1. Each answer adds to this process's ``Meter`` (a few counter increments, no I/O).
2. Once a second the load balancer's flush (apps/gateway/lbstate.py) adds the counts to this minute's
   Redis hash (``USAGE_KEY``) and the credentials' token totals (apps/gateway/limits.py) in the same round
   trip as its own, one script call per batch (``Outbox``). Redis away, they are kept and sent again; a
   batch is applied once however often it is sent (a frozen Redis runs the sends it holds when it
   resumes, and the send after it would count them again).
3. The sampling task (apps/observability/sampling.py) rolls each complete minute up into
   ``UsageSample`` rows on the observability alias. Losing that store never blocks serving
   (``OBSERVABILITY_DEGRADED``); Redis keeps the minutes for a day, so a store back within it loses none.

Tokens are the engine's own ``usage``. A stream reports it only when asked: the gateway asks
(``stream_options.include_usage``) whatever the client said (left out, ``null``, ``{}``, ``false``), keeps
the client's other options, and takes the usage-only chunk out of the stream it passes on unless the
client asked for it. So every stream a token limit or budget meters is counted. An engine that reports
no usage (one that ignores ``stream_options``) is counted in ``unmetered``, never guessed.
"""

from __future__ import annotations

import bisect
import json
import os
import secrets
from collections import Counter
from dataclasses import dataclass
from dataclasses import field as default
from typing import Any

import msgspec
from msgspec import UNSET

from apps.clusters.limits import keys as limit_keys

USAGE_KEY = "modelforge:usage:{bucket}"  # hash "<credential>␟<project>␟<capability>␟<backend>␟<metric>" -> n
USAGE_ROLLED_KEY = "modelforge:usage:rolled"  # the last minute (bucket) rolled up into the store
USAGE_KEEP_S = 24 * 3600
SEP = "\x1f"  # no credential id, project, capability or backend name holds a unit separator
METRICS = (
    "requests",
    "errors",
    "unmetered",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "ttft_count",
    "latency_ms",
)
_DECODER = json.JSONDecoder()
ASK_FOR_USAGE = b'"stream_options":{"include_usage":true},'
# Totals since the first flush, per capability and backend (no credential: a label per credential would
# be unbounded): Prometheus's counters and histograms on /metrics (apps/gateway/contributions.py).
TOTALS_KEY = "modelforge:usage:totals"
TOTALS = ("requests", "errors", "limited", "prompt_tokens", "completion_tokens")
# Admission's refusals (apps/gateway/admission.py) in the same hash, "<capability>␟<code>␟queue_refusals":
# the code (QUEUE_FULL, QUEUE_TIMEOUT) takes the backend's place, as a refused request reached none.
QUEUE_REFUSALS = "queue_refusals"
# Histogram buckets (seconds) of the time to first token (streams) and of the total time.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BUCKET_LABELS = (*(str(bound) for bound in BUCKETS), "inf")


# A pending row's fields (``Meter.record``): one list of integers per credential, project, capability and
# backend between two folds, so a request adds to a few list items instead of making a dozen string keys.
_REQUESTS, _ERRORS, _LIMITED, _UNMETERED, _METERED, _PROMPT, _COMPLETION = range(7)
_TTFT_MS, _TTFT_COUNT, _TTFT_SUM_US, _LATENCY_MS, _LATENCY_SUM_US = range(7, 12)
_TTFT_LE = 12
_LATENCY_LE = _TTFT_LE + len(BUCKET_LABELS)
_ROW = _LATENCY_LE + len(BUCKET_LABELS)


class Meter:
    """This process's counts since the last flush: ``counts`` per credential, project, capability and
    backend, ``totals`` per capability and backend (Counters of ``SEP``-joined fields). A request adds to
    its row of integers; the rows become fields when the counts are read (``take``, once a second)."""

    __slots__ = ("_counts", "_rows", "_totals")

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._totals: Counter[str] = Counter()
        self._rows: dict[tuple[str, str, str, str], list[int]] = {}

    def record(
        self,
        credential: str,
        project: str,
        capability: str,
        backend: str,
        status: int,
        usage: tuple[int, int] | None,
        ttft_s: float | None,
        latency_s: float,
        limited: bool = False,
    ) -> None:
        key = (credential, project, capability, backend)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = [0] * _ROW
        row[_REQUESTS] += 1
        if status >= 400:
            row[_ERRORS] += 1
            if limited:
                row[_LIMITED] += 1
        elif usage is None:
            row[_UNMETERED] += 1
        if usage is not None:
            row[_METERED] += 1
            row[_PROMPT] += usage[0]
            row[_COMPLETION] += usage[1]
        if ttft_s is not None:
            row[_TTFT_MS] += round(ttft_s * 1000)
            row[_TTFT_COUNT] += 1
            row[_TTFT_LE + bisect.bisect_left(BUCKETS, ttft_s)] += 1
            row[_TTFT_SUM_US] += round(ttft_s * 1e6)
        row[_LATENCY_MS] += round(latency_s * 1000)
        row[_LATENCY_LE + bisect.bisect_left(BUCKETS, latency_s)] += 1
        row[_LATENCY_SUM_US] += round(latency_s * 1e6)

    def _fold(self) -> None:
        """The pending rows into the Counters, as fields (a field is there when what it counts happened)."""
        rows, self._rows = self._rows, {}
        counts, totals = self._counts, self._totals
        for (credential, project, capability, backend), row in rows.items():
            prefix = f"{credential}{SEP}{project}{SEP}{capability}{SEP}{backend}{SEP}"
            total = f"{capability}{SEP}{backend}{SEP}"
            counts[prefix + "requests"] += row[_REQUESTS]
            totals[total + "requests"] += row[_REQUESTS]
            if row[_ERRORS]:
                counts[prefix + "errors"] += row[_ERRORS]
                totals[total + "errors"] += row[_ERRORS]
            if row[_LIMITED]:
                totals[total + "limited"] += row[_LIMITED]
            if row[_UNMETERED]:
                counts[prefix + "unmetered"] += row[_UNMETERED]
            if row[_METERED]:
                counts[prefix + "prompt_tokens"] += row[_PROMPT]
                counts[prefix + "completion_tokens"] += row[_COMPLETION]
                totals[total + "prompt_tokens"] += row[_PROMPT]
                totals[total + "completion_tokens"] += row[_COMPLETION]
            if row[_TTFT_COUNT]:
                counts[prefix + "ttft_ms"] += row[_TTFT_MS]
                counts[prefix + "ttft_count"] += row[_TTFT_COUNT]
                totals[total + "ttft_sum_us"] += row[_TTFT_SUM_US]
            counts[prefix + "latency_ms"] += row[_LATENCY_MS]
            totals[total + "latency_sum_us"] += row[_LATENCY_SUM_US]
            for i, label in enumerate(BUCKET_LABELS):
                if row[_TTFT_LE + i]:
                    totals[f"{total}ttft_le_{label}"] += row[_TTFT_LE + i]
                if row[_LATENCY_LE + i]:
                    totals[f"{total}latency_le_{label}"] += row[_LATENCY_LE + i]

    @property
    def counts(self) -> Counter[str]:
        self._fold()
        return self._counts

    @property
    def totals(self) -> Counter[str]:
        self._fold()
        return self._totals

    def queue_refused(self, capability: str, code: str) -> None:
        """A request refused by admission (``QUEUE_FULL``, ``QUEUE_TIMEOUT``): one increment, flushed with
        the totals to Redis, so /metrics adds up every web process's."""
        self._totals[f"{capability}{SEP}{code}{SEP}{QUEUE_REFUSALS}"] += 1

    def take(self) -> tuple[Counter[str], Counter[str]]:
        self._fold()
        counts, self._counts = self._counts, Counter()
        totals, self._totals = self._totals, Counter()
        return counts, totals


# One batch of usage, applied at most once: KEYS the process's guard, this minute's hash, the totals' hash,
# then three token keys (minute, day, month) per credential; ARGV the batch's number, the time the usage is
# kept, the number of usage fields and of totals fields, those fields and counts, then the tokens per
# credential. The guard holds the highest batch number applied: a process sends its unsent batches in
# order, every one of them each time, so a number at or below it was applied (by this send on another
# connection, or by one that a frozen Redis held and ran later).
APPLY_USAGE = """
local seq = tonumber(ARGV[1])
if seq <= tonumber(redis.call('GET', KEYS[1]) or '0') then
  return 0
end
redis.call('SET', KEYS[1], seq, 'EX', ARGV[2])
local n, m, at = tonumber(ARGV[3]), tonumber(ARGV[4]), 5
for i = 1, n do
  redis.call('HINCRBY', KEYS[2], ARGV[at], ARGV[at + 1])
  at = at + 2
end
if n > 0 then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
for i = 1, m do
  redis.call('HINCRBY', KEYS[3], ARGV[at], ARGV[at + 1])
  at = at + 2
end
local ttls = {120, 172800, 2764800}
for k = 4, #KEYS, 3 do
  for j = 0, 2 do
    redis.call('INCRBY', KEYS[k + j], ARGV[at])
    redis.call('EXPIRE', KEYS[k + j], ttls[j + 1])
  end
  at = at + 1
end
return 1
"""
APPLIED_KEY = "modelforge:usage:applied:{process}"


@dataclass
class _Batch:
    seq: int
    counts: Counter[str]
    totals: Counter[str]
    written: bool = False  # sent on a connection at least once: Redis may hold it and run it later


@dataclass
class Outbox:
    """This process's usage on its way to Redis, in numbered batches (``APPLY_USAGE``): a batch leaves
    once Redis has answered for it. Counts taken while the last batch was never written join it, so a
    Redis that refuses connections leaves one batch, not one a second."""

    guard: str = default(
        default_factory=lambda: APPLIED_KEY.format(process=f"{os.getpid():x}.{secrets.token_hex(6)}")
    )
    batches: list[_Batch] = default(default_factory=list)
    _seq: int = 0

    def add(self, counts: Counter[str], totals: Counter[str]) -> None:
        if not counts and not totals:
            return
        if self.batches and not self.batches[-1].written:
            self.batches[-1].counts.update(counts)
            self.batches[-1].totals.update(totals)
            return
        self._seq += 1
        self.batches.append(_Batch(self._seq, counts, totals))

    @property
    def retrying(self) -> bool:
        """A batch was written and not answered for: the next send waits for Redis to answer first."""
        return any(batch.written for batch in self.batches)

    def write(self, pipe: Any, bucket: int, now: float) -> None:
        """Every batch, in order, as one script call each on ``pipe`` (a lean or a redis-py pipeline)."""
        usage_key = USAGE_KEY.format(bucket=bucket)
        for batch in self.batches:
            tokens = tokens_per_credential(batch.counts)
            script_keys = [self.guard, usage_key, TOTALS_KEY]
            for credential in tokens:
                script_keys += limit_keys(credential, now)[2:]
            args: list[Any] = [batch.seq, USAGE_KEEP_S, len(batch.counts), len(batch.totals)]
            for counts in (batch.counts, batch.totals):
                for name, count in counts.items():
                    args += (name, count)
            args += tokens.values()
            pipe.eval(APPLY_USAGE, len(script_keys), *script_keys, *args)
            batch.written = True

    def sent(self) -> None:
        self.batches.clear()

    def pending(self) -> Counter[str]:
        """The usage counts not in Redis yet (the tests read them)."""
        counts: Counter[str] = Counter()
        for batch in self.batches:
            counts.update(batch.counts)
        return counts


def tokens_per_credential(counts: Counter[str]) -> Counter[str]:
    """Prompt and completion tokens per credential id, from a flush's counts."""
    tokens: Counter[str] = Counter()
    for field, count in counts.items():
        if field.endswith(("prompt_tokens", "completion_tokens")) and count:
            tokens[field.split(SEP, 1)[0]] += count
    return tokens


def split_field(field: str) -> tuple[str, str, str, str, str] | None:
    parts = field.split(SEP)
    if len(parts) != 5 or parts[4] not in METRICS:
        return None
    return parts[0], parts[1], parts[2], parts[3], parts[4]


def usage_in(body: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens of an answer's ``usage`` object, or None when it has none."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    start = body.find(b"{", at)
    if start < 0 or body[at + 7 : start].strip(b" \t\r\n:"):  # "usage": null, or not an object
        return None
    try:
        usage, _ = _DECODER.raw_decode(body[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    return _tokens(usage)


def _tokens(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int) or prompt < 0 or completion < 0:
        return None
    return prompt, completion


def asking_for_usage(body: bytes, options: Any) -> bytes | None:
    """A stream's request ``body`` (a JSON object) asking the engine for usage, given its decoded
    ``stream_options`` (``msgspec.UNSET``: the key is not there); None when the client asked itself.

    Left out (the usual case: the ``openai`` package sends none), the option goes in front, the rest of the
    bytes untouched. Otherwise (``null``, ``{}``, ``include_usage`` false or null) the body is decoded and
    encoded again with ``include_usage`` set and every other choice the client made kept (its other
    options; a key it sent twice once, with the last value, which is the one JSON parsers keep)."""
    if options is UNSET:  # msgspec matched every spelling of the key, an escaped one too: none is there
        at = body.index(b"{") + 1
        return body[:at] + ASK_FOR_USAGE + body[at:]
    if options is not None and options.include_usage is True:
        return None
    request = msgspec.json.decode(body)
    sent = request.get("stream_options")
    request["stream_options"] = (
        {**sent, "include_usage": True} if isinstance(sent, dict) else {"include_usage": True}
    )
    return msgspec.json.encode(request)


def usage_event(line: bytes) -> tuple[tuple[int, int] | None, bool]:
    """For one server-sent event line carrying ``"usage": {...}``: its tokens, and whether it is the
    usage-only chunk (no choices) that a client who did not ask for usage must not see."""
    payload = line.strip()
    if payload.startswith(b"data:"):
        payload = payload[5:].strip()
    try:
        chunk = json.loads(payload)
    except ValueError:
        return None, False
    if not isinstance(chunk, dict):
        return None, False
    return _tokens(chunk.get("usage")), chunk.get("choices") == []
