"""Health from the data plane: each gateway process probes every backend of its routing table.

A backend gets traffic only when the control plane lists it running (the routing table) AND it answered
a probe recently: ``GET`` of its runtime profile's health path (``launch.health_path``) on a fresh
connection, every MODELFORGE_GATEWAY_PROBE_EVERY_S, each within MODELFORGE_GATEWAY_PROBE_TIMEOUT_MS. A
fresh connection, not a pooled one: it proves the backend still accepts connections, and a probe never
waits behind the requests. A frozen process (SIGSTOP, a wedged engine) still completes TCP handshakes
through its kernel's backlog, so only an answer counts, never a connection alone.

- **Down**: MODELFORGE_GATEWAY_PROBE_FAILURES probes in a row without a 2xx (a timeout, a refused or
  broken connection, any other status). After a first failure the backends are probed again within half
  a second, so a frozen backend is out within about ``every + 2 x timeout`` seconds. A probe that timed
  out while real requests to the backend were being answered is not counted: a busy engine whose health
  path is slow (or this process's own loop, late under load) is not a dead one.
- **Up**: one probe answered 2xx.
- **Unknown** (never probed by anyone, or a verdict gone stale): no traffic blindly. A request that finds
  no candidate known up probes the unknown ones at once and waits for that probe (bounded by the probe
  timeout; concurrent requests share it); with another candidate up, it goes there and the unknown ones
  are probed beside it.
- **Shared**: each process's verdicts go to Redis with its once-a-second flush (apps/gateway/lbstate.py)
  and the others' come back in the same round trip. A backend that any process (with a fresh verdict)
  finds down is out for all; a process that has not probed a backend yet takes the others' "up". Redis
  away: each process goes on with its own probes.

The request path reads one frozenset (``healthy``): a backend's key in it, or the slow path here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

logger = logging.getLogger("modelforge.gateway")

PROBES_KEY = "modelforge:lb:probes"  # hash "<backend>|<process>" -> json verdict
PROBES_KEEP_S = 60  # the hash expires once no gateway process writes it
SUSPECT_RECHECK_S = 0.5  # after a failure, the next probe comes this soon
SEP = "|"


def every_s() -> float:
    return float(settings.GATEWAY_PROBE_EVERY_S)


def timeout_s() -> float:
    return settings.GATEWAY_PROBE_TIMEOUT_MS / 1000


def stale_after_s() -> float:
    """A verdict older than this is ignored (its process stopped probing: gone, or stuck)."""
    return 3 * every_s() + timeout_s() + 2 * 1.0


@dataclass
class ProbeState:
    """This process's view of one backend: its last probe, and since when the verdict holds."""

    name: str
    url: str
    up: bool | None  # None: never answered a probe yet (and never failed one)
    fails: int
    since: float  # wall time the verdict last changed
    checked_at: float  # wall time of the last probe
    reason: str  # of the last failure; "" when answered

    def export(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "up": self.up,
            "fails": self.fails,
            "since": self.since,
            "at": self.checked_at,
            "reason": self.reason,
        }


class Prober:
    """One per web process (``shared.probes``)."""

    def __init__(self, owner: Any) -> None:
        # The process's SharedState: its id, and the real answers from a backend so far (passive evidence).
        self.owner = owner
        self.verdicts: dict[str, ProbeState] = {}
        # Fresh verdicts of the other processes, per backend, as of the last flush.
        self.others: dict[str, list[dict[str, Any]]] = {}
        self.healthy: frozenset[str] = frozenset()  # the request path's one read
        self.known: frozenset[str] = frozenset()
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._beside: set[asyncio.Task[None]] = set()
        self.task: asyncio.Task[None] | None = None
        self._stopped = False
        self.rounds = 0

    # The request path's slow side ---------------------------------------------------------------

    async def usable(self, backends: list[Any]) -> list[Any]:
        """The backends known up; when none is, the unknown ones are probed now (bounded) first."""
        up = [b for b in backends if b.key in self.healthy]
        unknown = [b for b in backends if b.key not in self.known]
        if unknown:
            if up:  # traffic goes to those; the newcomers are probed beside it
                for backend in unknown:
                    self.probe_soon(backend)
                return up
            await asyncio.gather(*(self.probe(b) for b in unknown))
            up = [b for b in backends if b.key in self.healthy]
        return up

    def why_not(self, backends: Iterable[Any]) -> str:
        """Each backend's last probe failure, in words, for the refusal."""
        said = []
        for backend in backends:
            state = self.verdicts.get(backend.key)
            theirs = [v for v in self.others.get(backend.key, []) if v.get("up") is False]
            if state is not None and state.up is False:
                said.append(f"{backend.name} ({state.reason})")
            elif theirs:
                said.append(f"{backend.name} ({theirs[0].get('reason') or 'down'}, seen by another process)")
            else:
                said.append(f"{backend.name} (not probed yet)")
        return ", ".join(said)

    # Probing ------------------------------------------------------------------------------------

    def start(self, backends_now: Callable[[], list[Any]]) -> None:
        """Probe the routing table's backends from a task of the running loop (the serving loop)."""
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._probe_forever(backends_now))

    async def stop(self) -> None:
        self._stopped = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _probe_forever(self, backends_now: Callable[[], list[Any]]) -> None:
        while not self._stopped:
            try:
                backends = backends_now()
                keys = {b.key for b in backends}
                for key in [k for k in self.verdicts if k not in keys]:
                    del self.verdicts[key]  # out of the table: unknown again if it comes back
                await asyncio.gather(*(self.probe(b) for b in backends))
                self.rounds += 1
                self.recompute()
            except Exception:  # never let the prober die: the next round tries again
                logger.exception("backends not probed")
                backends = []
            suspects = any(s.fails and s.up is not False for s in self.verdicts.values())
            await asyncio.sleep(min(every_s(), SUSPECT_RECHECK_S) if suspects else every_s())

    def probe_soon(self, backend: Any) -> None:
        if backend.key not in self._pending:
            task = asyncio.get_running_loop().create_task(self.probe(backend))
            self._beside.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self._beside.discard)

    async def probe(self, backend: Any) -> None:
        """Probe ``backend`` once (or wait for the probe of it already under way)."""
        pending = self._pending.get(backend.key)
        if pending is not None:
            await asyncio.shield(pending)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[backend.key] = future
        try:
            await self._probe_once(backend)
        finally:
            del self._pending[backend.key]
            future.set_result(None)

    async def _probe_once(self, backend: Any) -> None:
        answered_before = self.owner.answered(backend.key)
        reason = ""
        try:
            status = await asyncio.wait_for(
                get_status(backend.url, getattr(backend, "health_path", "/health")), timeout_s()
            )
            if not 200 <= status < 300:
                reason = f"HTTP {status} from {getattr(backend, 'health_path', '/health')}"
        except TimeoutError:
            reason = f"no answer within {timeout_s():g} s"
        except OSError as exc:
            reason = f"no connection ({type(exc).__name__})"
        except Exception as exc:  # not an HTTP answer, a URL that is not http://host:port: a failure too
            reason = f"no health answer ({type(exc).__name__}: {exc})"[:200]
        now = time.time()
        state = self.verdicts.get(backend.key)
        if state is None or state.url != backend.url:
            state = self.verdicts[backend.key] = ProbeState(backend.name, backend.url, None, 0, now, now, "")
        state.checked_at = now
        if not reason:
            if state.up is False:
                logger.warning("backend %s answers its health probe again: back in rotation", backend.name)
            if state.up is not True:
                state.since = now
            state.up, state.fails, state.reason = True, 0, ""
            self._changed(backend.key)
            return
        if state.up and self.owner.answered(backend.key) > answered_before:
            # Real requests were answered meanwhile: the backend is alive, its health path slow.
            logger.info(
                "backend %s: probe failed (%s) while it answered requests; not counted", backend.name, reason
            )
            return
        state.fails += 1
        state.reason = reason
        if state.up is None or (state.up and state.fails >= settings.GATEWAY_PROBE_FAILURES):
            logger.warning(
                "backend %s failed its health probe %d time(s) in a row (%s): no traffic until it answers",
                backend.name,
                state.fails,
                reason,
            )
            state.up, state.since = False, now
            self._changed(backend.key)

    def _changed(self, key: str) -> None:
        # A verdict that moved applies at once (not at the next round).
        self.recompute()

    def recompute(self) -> None:
        now = time.time()
        stale = stale_after_s()
        own_up = {k for k, s in self.verdicts.items() if s.up}
        own_known = {k for k, s in self.verdicts.items() if s.up is not None}
        down_elsewhere: set[str] = set()
        up_elsewhere: set[str] = set()
        for key, verdicts in self.others.items():
            for verdict in verdicts:
                if now - float(verdict.get("at", 0)) > stale:
                    continue
                if verdict.get("up") is False:
                    down_elsewhere.add(key)
                elif verdict.get("up") is True:
                    up_elsewhere.add(key)
        self.healthy = frozenset((own_up | (up_elsewhere - own_known)) - down_elsewhere)
        self.known = frozenset(own_known | up_elsewhere | down_elsewhere)

    # Sharing through Redis (called by the flush) -------------------------------------------------

    def exported(self) -> dict[str, str]:
        """This process's verdicts, for the flush to write."""
        return {
            f"{key}{SEP}{self.owner.process_id}": json.dumps(state.export())
            for key, state in self.verdicts.items()
            if state.up is not None
        }

    def take_shared(self, raw: dict[Any, Any]) -> list[str]:
        """The other processes' verdicts from the flush's read; returns the stale fields to delete."""
        now = time.time()
        stale = stale_after_s()
        others: dict[str, list[dict[str, Any]]] = {}
        gone = []
        for raw_field, raw_value in (raw or {}).items():
            field = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
            key, _, process = field.partition(SEP)
            try:
                verdict = json.loads(raw_value)
            except ValueError:
                gone.append(field)
                continue
            if now - float(verdict.get("at", 0)) > max(stale, PROBES_KEEP_S / 2):
                gone.append(field)
                continue
            if process != self.owner.process_id:
                others.setdefault(key, []).append({**verdict, "process": process})
        self.others = others
        self.recompute()
        return gone

    def alone(self) -> None:
        """Redis away: this process's own probes only."""
        if self.others:
            self.others = {}
            self.recompute()


async def get_status(url: str, path: str) -> int:
    """The status of ``GET url+path`` on a connection of its own, closed after the status line."""
    from apps.gateway.upstream import _host_port

    host, port = _host_port(url)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        line = await reader.readline()
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError("not an HTTP answer")
        return int(parts[1])
    finally:
        writer.close()


def read_verdicts() -> dict[str, list[dict[str, Any]]] | None:
    """For the card, the API and /metrics: every process's fresh verdict per backend; None when Redis
    cannot be read."""
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        raw = client.hgetall(PROBES_KEY)
    except (redis.RedisError, OSError):
        return None
    return fresh_verdicts(raw)


def fresh_verdicts(raw: dict[Any, Any]) -> dict[str, list[dict[str, Any]]]:
    now = time.time()
    stale = stale_after_s()
    found: dict[str, list[dict[str, Any]]] = {}
    for raw_field, raw_value in raw.items():
        field = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
        key, _, process = field.partition(SEP)
        try:
            verdict = json.loads(raw_value)
        except ValueError:
            continue
        if now - float(verdict.get("at", 0)) <= stale:
            found.setdefault(key, []).append({**verdict, "process": process})
    return found


def summary(verdicts: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One backend's probe state across processes: down when any process finds it down."""
    if not verdicts:
        return {
            "state": "unknown",
            "since": None,
            "checked_at": None,
            "reason": "",
            "processes": 0,
            "down_in": 0,
        }
    down = [v for v in verdicts if v.get("up") is False]
    chosen = (
        min(down, key=lambda v: v.get("since", 0)) if down else max(verdicts, key=lambda v: v.get("at", 0))
    )
    return {
        "state": "down" if down else "up",
        "since": chosen.get("since"),
        "checked_at": max(float(v.get("at", 0)) for v in verdicts),
        "reason": chosen.get("reason", "") if down else "",
        "processes": len(verdicts),
        "down_in": len(down),
    }
