"""Usage per credential, project, capability and backend: requests, errors, tokens, time to first token
and total time, counted in memory per web process and written without a database write per request.

1. Each answer adds to this process's ``Meter`` (a few counter increments, no I/O).
2. Once a second the load balancer's flush (apps/gateway/lbstate.py) adds the counts to this minute's
   Redis hash (``USAGE_KEY``) in the same round trip as its own; Redis away, they are kept and added later.
3. The sampling task (apps/observability/sampling.py) rolls each complete minute up into
   ``UsageSample`` rows on the observability alias. Losing that store never blocks serving
   (``OBSERVABILITY_DEGRADED``); Redis keeps the minutes for a day, so a store back within it loses none.

Tokens are the engine's own ``usage``. A stream reports it only when asked: the gateway asks
(``stream_options.include_usage``) when the client did not, and takes the usage chunk out of the stream
it passes on. An engine that reports no usage is counted in ``unmetered``, never guessed.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from typing import Any

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


class Meter:
    """This process's counts since the last flush."""

    __slots__ = ("counts", "totals")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()

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
        prefix = f"{credential}{SEP}{project}{SEP}{capability}{SEP}{backend}{SEP}"
        total = f"{capability}{SEP}{backend}{SEP}"
        counts, totals = self.counts, self.totals
        counts[prefix + "requests"] += 1
        totals[total + "requests"] += 1
        if status >= 400:
            counts[prefix + "errors"] += 1
            totals[total + "errors"] += 1
            if limited:
                totals[total + "limited"] += 1
        elif usage is None:
            counts[prefix + "unmetered"] += 1
        if usage is not None:
            counts[prefix + "prompt_tokens"] += usage[0]
            counts[prefix + "completion_tokens"] += usage[1]
            totals[total + "prompt_tokens"] += usage[0]
            totals[total + "completion_tokens"] += usage[1]
        if ttft_s is not None:
            counts[prefix + "ttft_ms"] += round(ttft_s * 1000)
            counts[prefix + "ttft_count"] += 1
            totals[f"{total}ttft_le_{_bucket(ttft_s)}"] += 1
            totals[total + "ttft_sum_us"] += round(ttft_s * 1e6)
        counts[prefix + "latency_ms"] += round(latency_s * 1000)
        totals[f"{total}latency_le_{_bucket(latency_s)}"] += 1
        totals[total + "latency_sum_us"] += round(latency_s * 1e6)

    def queue_refused(self, capability: str, code: str) -> None:
        """A request refused by admission (``QUEUE_FULL``, ``QUEUE_TIMEOUT``): one increment, flushed with
        the totals to Redis, so /metrics adds up every web process's."""
        self.totals[f"{capability}{SEP}{code}{SEP}{QUEUE_REFUSALS}"] += 1

    def take(self) -> tuple[Counter[str], Counter[str]]:
        counts, self.counts = self.counts, Counter()
        totals, self.totals = self.totals, Counter()
        return counts, totals

    def put_back(self, counts: Counter[str], totals: Counter[str]) -> None:
        """Counts a flush could not write (Redis away): kept for the next one."""
        self.counts.update(counts)
        self.totals.update(totals)


def _bucket(seconds: float) -> str:
    """The histogram bucket a time falls in: its upper bound, or ``inf``."""
    return BUCKET_LABELS[bisect.bisect_left(BUCKETS, seconds)]


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


def asking_for_usage(body: bytes) -> bytes:
    """The request ``body`` (a JSON object) with ``stream_options.include_usage`` set, which it lacked."""
    at = body.index(b"{") + 1
    return body[:at] + ASK_FOR_USAGE + body[at:]


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
