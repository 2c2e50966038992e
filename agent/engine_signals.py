"""Engine signals: what a model server's engine says of its own load, read at heartbeat time.

llama.cpp's ``llama-server`` (started with ``--metrics``) and vLLM publish Prometheus text on
``GET /metrics``. Of it the agent keeps three figures per server, reported with the heartbeat (the
control plane puts them where every gateway process reads them, so no gateway scrapes any backend):

- ``running``: requests the engine is working on (llama.cpp ``llamacpp:requests_processing``, vLLM
  ``vllm:num_requests_running``);
- ``waiting``: requests queued inside the engine (``llamacpp:requests_deferred``,
  ``vllm:num_requests_waiting``);
- ``kv_cache_used``: the share of the KV cache in use, 0..1, or ``None`` when the engine does not say
  (``vllm:kv_cache_usage_perc``, before it ``vllm:gpu_cache_usage_perc``; llama.cpp's
  ``llamacpp:kv_cache_usage_ratio``, which builds since mid-2025 no longer publish).

vLLM labels its gauges per engine core (``engine="0"``...; data parallel): running and waiting are summed,
the KV share is the fullest core's. Which names to read follows the server's engine (the runtime
profile's ``engine``, which the control plane sends in the launch's ``meta``); a server launched without
it (an older control plane) is read in whichever dialect its text has.

Reading never delays a heartbeat: every server is read at once on a small pool, each read bounded by a
deadline (``READ_TIMEOUT_S``, the connection and every byte included); a late or failed read reports
nothing this time. A server whose engine has no such endpoint (llama-cpp-python's server, the echo
engine without ``--metrics``) or answers none of these names is remembered and asked again only every
``NO_METRICS_RETRY_S``, logged once at DEBUG: no log line per heartbeat for an engine that never will.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

logger = logging.getLogger("agent.engine_signals")

METRICS_PATH = "/metrics"
# A read's whole budget, connection and body included: an engine that cannot say within it is busy
# enough that its figure would be stale anyway.
READ_TIMEOUT_S = 0.25
# An engine with no (usable) metrics endpoint is asked again this long after.
NO_METRICS_RETRY_S = 300.0
# vLLM's full exposition (histograms per model) is some 100 KB; past this the text is not read.
MAX_METRICS_BYTES = 4 * 1024 * 1024
# Concurrent reads: a node runs a handful of servers; more wait for a free reader within the deadline.
MAX_READERS = 8
# Larger than any real queue; a figure past it is garbage, not load.
MAX_REQUESTS = 1_000_000


@dataclass(frozen=True)
class Dialect:
    """The metric names one engine publishes the three figures under, in order of preference."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_cache_used: tuple[str, ...]

    def names(self) -> frozenset[str]:
        return frozenset(self.running + self.waiting + self.kv_cache_used)


DIALECTS: dict[str, Dialect] = {
    "llamacpp": Dialect(
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        kv_cache_used=("llamacpp:kv_cache_usage_ratio",),
    ),
    "vllm": Dialect(
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        kv_cache_used=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
}
ALL_NAMES = frozenset().union(*(dialect.names() for dialect in DIALECTS.values()))


@dataclass(frozen=True)
class EngineReading:
    running: int
    waiting: int
    kv_cache_used: float | None
    at: float

    def as_payload(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_used": self.kv_cache_used,
            "at": round(self.at, 3),
        }


def _sample_value(line: str, name_end: int) -> str | None:
    """The value token of a sample line whose metric name ends at ``name_end``: after the label set
    (label values are quoted and may hold ``}``, spaces and escaped quotes), before any timestamp."""
    position = name_end
    if position < len(line) and line[position] == "{":
        quoted = escaped = False
        for position in range(name_end + 1, len(line)):
            char = line[position]
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = quoted
            elif char == '"':
                quoted = not quoted
            elif char == "}" and not quoted:
                break
        else:
            return None  # the label set never closes
        position += 1
    rest = line[position:].split()
    return rest[0] if rest else None


def parse_samples(text: str, wanted: Iterable[str]) -> dict[str, list[float]]:
    """The finite values of the ``wanted`` metrics in Prometheus text exposition, by name (one value per
    labelled series). Comments, other metrics and lines that do not parse are skipped."""
    wanted = frozenset(wanted)
    found: dict[str, list[float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        name_end = len(line)
        for index, char in enumerate(line):
            if char == "{" or char.isspace():
                name_end = index
                break
        name = line[:name_end]
        if name not in wanted:
            continue
        token = _sample_value(line, name_end)
        if token is None:
            continue
        try:
            value = float(token)
        except ValueError:
            continue
        if math.isfinite(value):
            found.setdefault(name, []).append(value)
    return found


def _first(samples: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    for name in names:
        if name in samples:
            return samples[name]
    return None


def _count(values: list[float]) -> int | None:
    total = sum(values)
    if total < 0 or total > MAX_REQUESTS:
        return None
    return round(total)


def reading_from(text: str, engine: str, at: float) -> EngineReading | None:
    """The engine's figures from its metrics text, or ``None`` when it has no running and waiting
    figures in the dialect of ``engine`` (any dialect, for an engine not named)."""
    dialects = [DIALECTS[engine]] if engine in DIALECTS else list(DIALECTS.values())
    samples = parse_samples(text, ALL_NAMES)
    for dialect in dialects:
        running, waiting = _first(samples, dialect.running), _first(samples, dialect.waiting)
        if running is None or waiting is None:
            continue
        running_count, waiting_count = _count(running), _count(waiting)
        if running_count is None or waiting_count is None:
            return None
        kv = _first(samples, dialect.kv_cache_used)
        kv_used = max(kv) if kv else None
        if kv_used is not None and not 0 <= kv_used <= 1:
            kv_used = None  # not a share: not reported, rather than reported wrong
        return EngineReading(running_count, waiting_count, kv_used, at)
    return None


class NoMetrics(Exception):
    """The engine answered, but with no metrics this agent can read (404, 501, none of the names)."""


class Server(Protocol):
    """What the reader needs of a managed server (agent.processes.ManagedServer)."""

    server_id: str
    port: int
    state: str
    meta: dict[str, Any]


def fetch_metrics(client: httpx.Client, port: int, deadline: float) -> str:
    """The engine's metrics text; ``NoMetrics`` when it has none, ``TimeoutError`` past ``deadline``
    (a monotonic time), an ``httpx.HTTPError`` when it cannot be reached."""
    with client.stream("GET", f"http://127.0.0.1:{port}{METRICS_PATH}") as response:
        if response.status_code != 200:
            raise NoMetrics(f"{METRICS_PATH} answered {response.status_code}")
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_METRICS_BYTES:
                raise NoMetrics(f"{METRICS_PATH} is larger than {MAX_METRICS_BYTES} bytes")
            if time.monotonic() > deadline:
                raise TimeoutError
    return body.decode("utf-8", "replace")


class EngineSignalReader:
    """Reads every running server's engine figures for one heartbeat; remembers which have none."""

    def __init__(
        self,
        *,
        timeout_s: float = READ_TIMEOUT_S,
        retry_s: float = NO_METRICS_RETRY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.clock = clock
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s), trust_env=False)
        self._pool = ThreadPoolExecutor(max_workers=MAX_READERS, thread_name_prefix="engine-signals")
        self._lock = threading.Lock()
        # server id -> monotonic time before which its engine is not asked again
        self._none_until: dict[str, float] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def _read_one(self, server: Server, deadline: float) -> EngineReading | None:
        engine = str(server.meta.get("engine") or "")
        try:
            text = fetch_metrics(self._client, server.port, deadline)
            reading = reading_from(text, engine, self.clock())
            if reading is None:
                raise NoMetrics(f"{METRICS_PATH} has no running/waiting figures this agent reads")
        except NoMetrics as exc:
            with self._lock:
                self._none_until[server.server_id] = time.monotonic() + self.retry_s
            logger.debug(
                "server %s: its engine reports no load (%s); asked again in %.0f s",
                server.server_id,
                exc,
                self.retry_s,
            )
            return None
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            # Busy, restarting or gone: this heartbeat reports nothing for it; the next one asks again.
            logger.debug(
                "server %s: its engine's metrics not read (%s)", server.server_id, type(exc).__name__
            )
            return None
        except Exception:
            # Whatever else: the signals are an extra, never a reason to miss a heartbeat.
            logger.debug("server %s: its engine's metrics not read", server.server_id, exc_info=True)
            return None
        return reading

    def read(self, servers: Iterable[Server]) -> list[dict[str, Any]]:
        """The heartbeat's ``servers`` entries: ``{"server_id", "engine": {...}}`` for each running server
        whose engine answered in time; none for the others. Returns within about ``timeout_s``."""
        now = time.monotonic()
        candidates = [s for s in servers if s.state == "running"]
        with self._lock:
            present = {s.server_id for s in candidates}
            for gone in set(self._none_until) - present:
                del self._none_until[gone]
            due = [s for s in candidates if self._none_until.get(s.server_id, 0.0) <= now]
        if not due:
            return []
        deadline = now + self.timeout_s
        futures: dict[Future[EngineReading | None], Server] = {}
        for server in due:
            futures[self._pool.submit(self._read_one, server, deadline)] = server
        # A little past the reads' own deadline: they stop themselves; a straggler is not waited for.
        done, _ = wait(futures, timeout=self.timeout_s + 0.05)
        entries: list[dict[str, Any]] = []
        for future in done:
            if future.exception() is not None:
                continue
            reading = future.result()
            if reading is not None:
                entries.append({"server_id": futures[future].server_id, "engine": reading.as_payload()})
        entries.sort(key=lambda entry: str(entry["server_id"]))
        return entries
