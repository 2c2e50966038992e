"""Admission's queue in one process, step by step: the order it serves credentials in, a full queue, the
deadline, a client that leaves (also in the very moment its slot comes), and room freed by the other web
processes. The same behaviour over real HTTP is in test_admission_http.py."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from apps.clusters.bindings import Backend
from apps.gateway.admission import Admission, QueueRefusal, fair_share
from apps.gateway.lbstate import shared
from apps.gateway.usage import QUEUE_REFUSALS, SEP
from tests.fixtures import run_in_own_loop

_keys = itertools.count()


def limited_backend(limit: int | None = 1) -> Backend:
    key = f"admission-test-{next(_keys)}"
    return Backend(key, key, "http://127.0.0.1:1", 1, max_concurrent=limit)


class Client:
    """An ASGI ``receive`` after the body was read: nothing, until the client leaves."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}


class Requests:
    """Requests through one Admission as the gateway makes them: taken, counted in flight, released."""

    def __init__(self, admission: Admission, backend: Backend, capability: str = "chat.a@1") -> None:
        self.admission, self.backend, self.capability = admission, backend, capability
        self.served: list[str] = []  # in the order they got their slot
        self.refused: dict[str, str] = {}

    async def start(self, name: str, credential: str, client: Client | None = None) -> Backend | None:
        try:
            got = await self.admission.take(
                [self.backend], "weighted_round_robin", set(), self.capability, credential,
                (client or Client()).receive,
            )  # fmt: skip
        except QueueRefusal as exc:
            self.refused[name] = f"{exc.status} {exc.code}"
            return None
        assert got is not None
        shared.in_flight[got.key] += 1  # as Gateway._forward, before any await
        self.served.append(name)
        return got

    async def end_and_next(self) -> None:
        """End one request, and let the waiter it hands its slot to resume."""
        before = len(self.served)
        self.end()
        while len(self.served) == before:
            await asyncio.sleep(0)

    def end(self) -> None:
        shared.in_flight[self.backend.key] -= 1
        if self.admission.waiting:
            self.admission.released(self.backend.key)


def run(main: Callable[[], Any]) -> None:
    shared.usage.take()  # counts of earlier tests: each test reads only its own refusals
    run_in_own_loop(main)


def refusals(capability: str) -> dict[str, int]:
    """Admission's refusals of ``capability`` counted for the next flush (/metrics), per code."""
    found = {}
    for field, count in shared.usage.totals.items():
        name, code, metric = field.split(SEP)
        if name == capability and metric == QUEUE_REFUSALS:
            found[code] = count
    return found


def test_the_fair_share_never_leaves_a_process_without_a_slot():
    assert fair_share(8, 0, 1) == 8  # alone: the whole limit
    assert fair_share(8, 0, 2) == 8  # the other process idle: all of it
    assert fair_share(8, 6, 2) == 4  # the other busy: at least its half
    assert fair_share(8, 3, 2) == 5  # what the other leaves
    assert fair_share(3, 3, 4) == 1  # more processes than slots: one each


def test_credentials_are_served_in_turn_and_a_free_slot_never_waits(settings):
    settings.GATEWAY_QUEUE_MAX_WAITING, settings.GATEWAY_QUEUE_DEADLINE_S = 20, 10
    admission = Admission()
    requests = Requests(admission, limited_backend(1))

    async def main() -> None:
        await requests.start("holder", "a")  # room: served at once
        assert requests.served == ["holder"] and admission.waiting == 0
        waiting = [asyncio.create_task(requests.start(f"a{i}", "a")) for i in range(1, 6)]
        await asyncio.sleep(0)
        waiting.append(asyncio.create_task(requests.start("b1", "b")))
        await asyncio.sleep(0)
        assert admission.waiting == 6 and shared.queued["chat.a@1"] == 6
        for _ in range(6):
            await requests.end_and_next()  # each end hands the slot to the next in turn
        await asyncio.gather(*waiting)
        requests.end()
        # b's one request came second: a's backlog of five did not hold it back.
        assert requests.served == ["holder", "a1", "b1", "a2", "a3", "a4", "a5"]
        assert admission.waiting == 0 and not admission.queues and not admission.wanting
        assert "chat.a@1" not in shared.queued and shared.in_flight[requests.backend.key] == 0

    run(main)


def test_a_full_queue_refuses_from_the_credential_with_the_most_waiting(settings):
    settings.GATEWAY_QUEUE_MAX_WAITING, settings.GATEWAY_QUEUE_DEADLINE_S = 3, 10
    admission = Admission()
    requests = Requests(admission, limited_backend(1))

    async def main() -> None:
        await requests.start("holder", "a")
        tasks = [asyncio.create_task(requests.start(f"a{i}", "a")) for i in range(1, 4)]
        await asyncio.sleep(0)
        # Full (3): a's fourth is refused, since a holds the most.
        await requests.start("a4", "a")
        assert requests.refused == {"a4": "503 QUEUE_FULL"}
        # b has none waiting: it takes the place of a's newest, which is refused instead.
        tasks.append(asyncio.create_task(requests.start("b1", "b")))
        await asyncio.sleep(0.01)
        assert requests.refused == {"a4": "503 QUEUE_FULL", "a3": "503 QUEUE_FULL"}
        assert admission.waiting == 3
        # Both counted for /metrics (the newcomer refused and the waiter pushed out), with the code.
        assert refusals("chat.a@1") == {"QUEUE_FULL": 2}
        for _ in range(3):
            await requests.end_and_next()
        await asyncio.gather(*tasks)
        requests.end()
        assert requests.served == ["holder", "a1", "b1", "a2"]

    run(main)


def test_past_the_deadline_a_waiter_is_refused_and_leaves_the_queue(settings):
    settings.GATEWAY_QUEUE_MAX_WAITING, settings.GATEWAY_QUEUE_DEADLINE_S = 5, 1
    admission = Admission()
    requests = Requests(admission, limited_backend(1))

    async def main() -> None:
        await requests.start("holder", "a")
        try:
            await admission.take(
                [requests.backend], "weighted_round_robin", set(), "chat.a@1", "b", Client().receive
            )
        except QueueRefusal as exc:
            refusal = exc
        assert refusal.status == 503 and refusal.code == "QUEUE_TIMEOUT"
        assert refusal.headers == {"retry-after": "5"}
        assert refusals("chat.a@1") == {"QUEUE_TIMEOUT": 1}
        assert "MODELFORGE_GATEWAY_QUEUE_DEADLINE_S" in refusal.message
        assert admission.waiting == 0 and not admission.wanting
        requests.end()
        assert shared.in_flight[requests.backend.key] == 0

    run(main)


def test_a_client_that_leaves_gives_up_its_place_and_a_slot_handed_as_it_leaves(settings):
    settings.GATEWAY_QUEUE_MAX_WAITING, settings.GATEWAY_QUEUE_DEADLINE_S = 5, 10
    admission = Admission()
    requests = Requests(admission, limited_backend(1))

    async def main() -> None:
        await requests.start("holder", "a")
        leaving, gone_at_once, staying = Client(), Client(), Client()
        first = asyncio.create_task(requests.start("leaves", "a", leaving))
        second = asyncio.create_task(requests.start("leaves-as-served", "b", gone_at_once))
        third = asyncio.create_task(requests.start("stays", "c", staying))
        await asyncio.sleep(0)
        assert admission.waiting == 3
        leaving.left.set()  # gone while waiting: out of the queue at once
        await first
        assert requests.refused == {"leaves": "499 CLIENT_CLOSED_REQUEST"} and admission.waiting == 2
        # The slot comes to the second in the same moment its client goes: it passes to the third.
        gone_at_once.left.set()
        requests.end()
        await asyncio.gather(second, third)
        assert requests.refused["leaves-as-served"] == "499 CLIENT_CLOSED_REQUEST"
        assert requests.served == ["holder", "stays"]
        assert admission.reserved[requests.backend.key] == 0 and admission.waiting == 0
        requests.end()
        assert shared.in_flight[requests.backend.key] == 0

    run(main)


def test_room_freed_by_the_other_processes_goes_to_the_waiters_at_the_flush(settings):
    settings.GATEWAY_QUEUE_MAX_WAITING, settings.GATEWAY_QUEUE_DEADLINE_S = 5, 10
    admission = Admission()
    backend = limited_backend(4)
    requests = Requests(admission, backend)
    shared.processes, shared.others_in_flight[backend.key] = 2, 3  # the other process has 3 of the 4

    async def main() -> None:
        await requests.start("mine-1", "a")
        await requests.start("mine-2", "a")  # its share: 2 of 4, though 3 + 2 > 4 (counts lag a second)
        waiter = asyncio.create_task(requests.start("waits", "a"))
        await asyncio.sleep(0)
        assert admission.waiting == 1
        shared.others_in_flight[backend.key] = 1  # as a flush reads it
        admission.recheck()
        await waiter
        assert requests.served == ["mine-1", "mine-2", "waits"]
        for _ in range(3):
            requests.end()

    try:
        run(main)
    finally:
        shared.processes = 1
        shared.others_in_flight.pop(backend.key, None)


def test_no_limit_means_no_admission():
    assert Admission.limited([limited_backend(None), limited_backend(None)]) is False
    assert Admission.limited([limited_backend(None), limited_backend(2)]) is True


@pytest.mark.parametrize("limit", [1, 3])
def test_a_backend_takes_at_most_its_limit(settings, limit):
    settings.GATEWAY_QUEUE_MAX_WAITING, settings.GATEWAY_QUEUE_DEADLINE_S = 50, 10
    admission = Admission()
    requests = Requests(admission, limited_backend(limit))

    async def main() -> None:
        tasks = [asyncio.create_task(requests.start(f"r{i}", str(i % 3))) for i in range(10)]
        await asyncio.sleep(0)
        assert len(requests.served) == limit and admission.waiting == 10 - limit
        most = 0
        while len(requests.served) < 10:
            most = max(most, shared.in_flight[requests.backend.key])
            before = len(requests.served)
            requests.end()
            while len(requests.served) == before:  # the next one resumes
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert most == limit
        for _ in range(limit):
            requests.end()
        assert shared.in_flight[requests.backend.key] == 0

    run(main)


def test_a_waiter_that_leaves_does_not_cost_its_credential_its_turn(settings):
    settings.GATEWAY_QUEUE_MAX_WAITING, settings.GATEWAY_QUEUE_DEADLINE_S = 10, 10
    admission = Admission()
    requests = Requests(admission, limited_backend(1))

    async def main() -> None:
        await requests.start("holder", "x")
        leaving = Client()
        tasks = [
            asyncio.create_task(requests.start("a1", "a")),
            asyncio.create_task(requests.start("a2", "a", leaving)),
            asyncio.create_task(requests.start("b1", "b")),
            asyncio.create_task(requests.start("c1", "c")),
        ]
        await asyncio.sleep(0)
        leaving.left.set()  # a's second goes; a is still first in turn
        while "a2" not in requests.refused:
            await asyncio.sleep(0)
        for _ in range(3):
            await requests.end_and_next()
        await asyncio.gather(*tasks)
        requests.end()
        assert requests.served == ["holder", "a1", "b1", "c1"]

    run(main)
