"""Admission: each backend's concurrency limit, and a bounded, fair queue for the requests beyond it.

A runtime profile may set ``max_concurrent`` (apps/servers/profiles.py): the gateway then sends each of its
servers at most that many requests at once. A request that finds every usable candidate full waits in its
capability's queue, at most ``MODELFORGE_GATEWAY_QUEUE_DEADLINE_S``, and is refused ``503 QUEUE_TIMEOUT``
with ``Retry-After`` past it; a queue holding ``MODELFORGE_GATEWAY_QUEUE_MAX_WAITING`` requests refuses
the next ``503 QUEUE_FULL``; both are counted on /metrics
(``modelforge_gateway_queue_refusals_total{capability,code}``). A profile without the field costs nothing:
``limited`` is False and the gateway picks as before, with no queue in the way.

- **Fair across credentials.** Each capability's queue keeps one sub-queue per credential and serves them
  in turn (round-robin), oldest first within each: a key with a hundred waiting cannot keep another key's
  one request waiting behind them. A full queue drops from the longest sub-queue (fair queueing's
  longest-queue-drop): a newcomer whose credential has fewer waiting than the one with the most takes the
  place of that one's newest waiter, which is refused ``QUEUE_FULL`` instead. So a flood fills the queue
  for its own key only.
- **A freed slot is handed on, never raced for.** When a request to a limited backend ends (its answer
  complete, streams included), its slot goes straight to the next waiter that may use that backend
  (``released``); a request arriving meanwhile cannot take it first. A request never waits while one of
  its candidates has room: whenever room appears, the waiters get it before anyone else can look.
- **Across web processes**, the limit holds as an estimate: this process's own in-flight count exactly,
  the others' as of their last flush (``SharedState``, once a second). Each process may always use its
  fair share, ``ceil(max_concurrent / processes)``: counts a second old can then never leave every process
  waiting on the others, and with accurate counts the processes together stay within the limit. For up
  to a second after a burst moves between processes they may together exceed it; the engine's own queue
  takes that. (With more web processes than ``max_concurrent``, each may still send one.)
- **A client that leaves while waiting** leaves the queue at once (its connection's ``http.disconnect``
  is watched while it waits); a slot handed to it in that same moment is handed on. The access log shows
  status 499 for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from typing import Any

from django.conf import settings

from apps.clusters import codes
from apps.clusters.bindings import Backend
from apps.gateway.affinity import Ask
from apps.gateway.lbstate import shared
from apps.gateway.routing import router

# Retry-After of a queue refusal: as the gateway's other 503s (NO_ELIGIBLE_NODE).
RETRY_AFTER_S = 5
# Status of a request whose client left while it waited (nginx's "client closed request"): the log's.
CLIENT_GONE = 499
CLIENT_CLOSED_REQUEST = "CLIENT_CLOSED_REQUEST"  # never seen by the client: it has gone


class QueueRefusal(Exception):
    """A refusal of admission, in the gateway's Refusal shape (status, code, message, headers)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = {"retry-after": str(RETRY_AFTER_S)} if status == 503 else {}


class Waiter:
    __slots__ = ("candidates", "credential", "future", "since")

    def __init__(self, credential: str, candidates: dict[str, Backend], future: asyncio.Future[Any]) -> None:
        self.credential, self.candidates, self.future = credential, candidates, future
        self.since = time.monotonic()


class Queue:
    """One capability's waiters: a sub-queue per credential, served in ``turn``."""

    __slots__ = ("capability", "count", "turn", "waiting")

    def __init__(self, capability: str) -> None:
        self.capability = capability
        self.waiting: dict[str, deque[Waiter]] = {}
        self.turn: deque[str] = deque()  # credentials with waiters; the first is served next
        self.count = 0


def fair_share(limit: int, others: int, processes: int) -> int:
    """How many requests this process may have in flight to a backend of ``limit``: what the other
    processes leave of it (``others`` in flight as of their last flush), and never less than its share."""
    return max(-(-limit // max(processes, 1)), limit - others)


class Admission:
    """One per web process."""

    def __init__(self) -> None:
        self.queues: dict[str, Queue] = {}
        self.waiting = 0  # every waiter of this process: the gateway's hot path reads it
        self.reserved: Counter[str] = Counter()  # slots handed to a waiter that has not resumed yet
        self.wanting: Counter[str] = Counter()  # backend key -> waiters that may take it

    @staticmethod
    def limited(backends: list[Backend]) -> bool:
        """True when some candidate has a limit: only then does a request go through ``take``."""
        for backend in backends:  # noqa: SIM110 -- any() over a generator: 6x the time
            if backend.max_concurrent is not None:
                return True
        return False

    def room(self, backend: Backend) -> bool:
        limit = backend.max_concurrent
        if limit is None:
            return True
        used = shared.in_flight.get(backend.key, 0) + self.reserved.get(backend.key, 0)
        return used < fair_share(limit, shared.others_in_flight.get(backend.key, 0), shared.processes)

    async def take(
        self,
        backends: list[Backend],
        algorithm: str,
        tried: set[str],
        capability: str,
        credential: str,
        receive: Any,
        ask: Ask | None = None,
        ring_of: list[Backend] | None = None,
    ) -> Backend | None:
        """A backend with room, picked by the algorithm among those that have room; else wait in the
        capability's queue for one. ``None`` when every candidate was tried. The caller counts the backend
        in flight before its next ``await`` (``Gateway._forward``) and calls ``released`` after."""
        choices = [b for b in backends if b.key not in tried] if tried else backends
        if not choices:
            return None
        free = [b for b in choices if self.room(b)]
        if free:
            return router.pick(free, algorithm, None, ask, ring_of or backends)
        return await self._wait(choices, capability, credential, receive)

    def released(self, key: str) -> None:
        """A request to ``key`` ended (its in-flight count already lowered): hand its slot on."""
        while self.wanting.get(key):
            found = self._next_for(key)
            if found is None:
                return
            queue, waiter = found
            backend = waiter.candidates[key]
            if not self.room(backend):
                return
            self._remove(queue, waiter, served=True)
            self.reserved[key] += 1
            waiter.future.set_result(backend)

    def recheck(self) -> None:
        """After a flush: the other processes' counts moved, and with them the room each backend has."""
        for key in [k for k, n in self.wanting.items() if n > 0]:
            self.released(key)

    # --- the queue ------------------------------------------------------------------------------------

    async def _wait(self, choices: list[Backend], capability: str, credential: str, receive: Any) -> Backend:
        queue = self.queues.get(capability)
        if queue is None:
            queue = self.queues[capability] = Queue(capability)
        if queue.count >= settings.GATEWAY_QUEUE_MAX_WAITING:
            self._make_room(queue, capability, credential)
        waiter = Waiter(credential, {b.key: b for b in choices}, asyncio.get_running_loop().create_future())
        self._add(queue, waiter)
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait(
                (waiter.future, gone),
                timeout=settings.GATEWAY_QUEUE_DEADLINE_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        except BaseException:  # cancelled (the server stopping): leave, and pass on a slot handed meanwhile
            self._leave(queue, waiter)
            raise
        finally:
            gone.cancel()
        left = gone.done() and not gone.cancelled()
        if not waiter.future.done() or left:
            self._leave(queue, waiter)
            if left:
                raise QueueRefusal(
                    CLIENT_GONE, CLIENT_CLOSED_REQUEST, "The client closed the connection while it waited."
                )
            waited = time.monotonic() - waiter.since
            shared.usage.queue_refused(capability, codes.QUEUE_TIMEOUT)
            raise QueueRefusal(
                503,
                codes.QUEUE_TIMEOUT,
                f"Every backend of {capability!r} stayed at its concurrency limit (its runtime profile's "
                f"max_concurrent) for the {waited:.0f} s this request may wait "
                "(MODELFORGE_GATEWAY_QUEUE_DEADLINE_S). Retry later, or add servers to the capability.",
            )
        backend: Backend = waiter.future.result()  # raises the QUEUE_FULL of a waiter pushed out
        self.reserved[backend.key] -= 1  # in flight from here: the caller counts it before any await
        return backend

    def _make_room(self, queue: Queue, capability: str, credential: str) -> None:
        """A full queue: refuse the newcomer, or, when its credential has fewer waiting than the one with
        the most, that one's newest waiter (longest-queue-drop)."""
        mine = len(queue.waiting.get(credential, ()))
        heaviest = max(queue.waiting, key=lambda c: len(queue.waiting[c]))
        refusal = QueueRefusal(
            503,
            codes.QUEUE_FULL,
            f"{queue.count} requests already wait for a backend of {capability!r}, every one at its "
            "concurrency limit (MODELFORGE_GATEWAY_QUEUE_MAX_WAITING). Retry later, or add servers to the "
            "capability.",
        )
        shared.usage.queue_refused(capability, codes.QUEUE_FULL)  # the newcomer or the one pushed out
        if len(queue.waiting[heaviest]) <= mine + 1:
            raise refusal
        pushed = queue.waiting[heaviest][-1]
        self._remove(queue, pushed)
        pushed.future.set_exception(refusal)

    def _add(self, queue: Queue, waiter: Waiter) -> None:
        waiters = queue.waiting.get(waiter.credential)
        if waiters is None:
            waiters = queue.waiting[waiter.credential] = deque()
            queue.turn.append(waiter.credential)
        waiters.append(waiter)
        queue.count += 1
        self.waiting += 1
        shared.queued[queue.capability] += 1
        for key in waiter.candidates:
            self.wanting[key] += 1

    def _remove(self, queue: Queue, waiter: Waiter, served: bool = False) -> None:
        waiters = queue.waiting[waiter.credential]
        waiters.remove(waiter)
        if not waiters:
            del queue.waiting[waiter.credential]
            queue.turn.remove(waiter.credential)
        elif served:  # its turn is used: its next waiter goes to the back (one that left keeps its place)
            queue.turn.remove(waiter.credential)
            queue.turn.append(waiter.credential)
        queue.count -= 1
        self.waiting -= 1
        shared.queued[queue.capability] -= 1
        if not queue.count:
            del self.queues[queue.capability]
            del shared.queued[queue.capability]
        for key in waiter.candidates:
            self.wanting[key] -= 1
            if not self.wanting[key]:
                del self.wanting[key]

    def _leave(self, queue: Queue, waiter: Waiter) -> None:
        """The waiter goes (deadline, client gone, cancelled): out of the queue, or, if a slot was handed
        to it already, the slot handed on."""
        if not waiter.future.done():
            self._remove(queue, waiter)
            waiter.future.cancel()
        elif not waiter.future.cancelled() and waiter.future.exception() is None:
            key = waiter.future.result().key
            self.reserved[key] -= 1
            self.released(key)

    def _next_for(self, key: str) -> tuple[Queue, Waiter] | None:
        """The waiter whose turn it is among those that may take ``key``: in each capability's queue the
        first credential in turn with such a waiter (its oldest); across capabilities the one waiting
        longest."""
        best: tuple[Queue, Waiter] | None = None
        for queue in self.queues.values():
            for credential in queue.turn:
                waiter = next((w for w in queue.waiting[credential] if key in w.candidates), None)
                if waiter is not None:
                    if best is None or waiter.since < best[1].since:
                        best = (queue, waiter)
                    break
        return best


async def _disconnect(receive: Any) -> None:
    """Returns when the client has gone (the request's body is read by now: nothing else can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


admission = Admission()
shared.after_flush = admission.recheck
shared.reserved = admission.reserved  # flushed with the in-flight counts
