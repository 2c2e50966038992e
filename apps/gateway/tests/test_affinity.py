"""prefix_affinity and least_outstanding, in one process: the prefix a request is placed by, the ring's
properties (the same in every process, shares by weight, only a leaving backend's prefixes move), the
bounded load, and least_outstanding's estimate. Across real gateway processes: test_affinity_http.py."""

from __future__ import annotations

import math
from collections import Counter

import msgspec
import pytest

from apps.clusters.bindings import Backend
from apps.clusters.models import Algorithm
from apps.gateway.affinity import (
    Ring,
    Rings,
    bounded_pick,
    conversation_prefix,
    estimated_tokens,
    prefix_hash,
)
from apps.gateway.gateway import asked
from apps.gateway.lbstate import ENGINE_REQUEST_TOKENS, shared
from apps.gateway.routing import Router
from apps.gateway.shapes import checked


def backends(*weights: int) -> list[Backend]:
    return [
        Backend(key=f"server-{i}", name=f"c/m{i}", url="http://127.0.0.1:1", weight=w)
        for i, w in enumerate(weights)
    ]


def chat(system: str, user: str = "hello", **extra: object) -> tuple[bytes, object]:
    body = msgspec.json.encode(
        {
            "model": "chat.general@1",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            **extra,
        }
    )
    return body, checked("/v1/chat/completions", body)


POINTS = [prefix_hash(f"tenant {i}") for i in range(4000)]


def test_every_process_builds_the_same_ring_and_weights_set_the_shares():
    ring, again = Ring(backends(1, 1, 2)), Ring(list(reversed(backends(1, 1, 2))))
    homes = [ring.home(p).key for p in POINTS]  # type: ignore[union-attr]
    assert homes == [again.home(p).key for p in POINTS]  # type: ignore[union-attr]
    shares = Counter(homes)
    assert shares["server-2"] / len(POINTS) == pytest.approx(0.5, abs=0.08)
    assert shares["server-0"] / len(POINTS) == pytest.approx(0.25, abs=0.08)


def test_a_backend_that_leaves_moves_only_its_own_prefixes():
    full = backends(1, 1, 1, 1)
    ring, without = Ring(full), Ring(full[:2] + full[3:])
    moved = [(ring.home(p).key, without.home(p).key) for p in POINTS]  # type: ignore[union-attr]
    assert {before for before, after in moved if before != after} == {"server-2"}
    # Its prefixes spread over the others, each to the next backend on the whole ring.
    assert len({after for before, after in moved if before == "server-2"}) > 1
    for p in POINTS[:200]:
        if ring.home(p).key == "server-2":  # type: ignore[union-attr]
            walk = [b.key for b in ring.walk(p)]
            assert without.home(p).key == walk[1]  # type: ignore[union-attr]


def test_a_prefix_stays_home_until_the_load_cap_then_the_next_on_the_ring_takes_it():
    ring = Ring(backends(1, 1, 1))
    load: Counter[str] = Counter()
    point = POINTS[0]
    order = [b.key for b in ring.walk(point)]
    picked = []
    for _ in range(30):
        backend, home = bounded_pick(ring, point, ring.backends, load.__getitem__, 125)
        assert backend is not None
        picked.append((backend.key, home))
        load[backend.key] += 1
        total = sum(load.values())
        for n in load.values():  # never above ceil(1.25 x mean)
            assert n <= math.ceil(1.25 * total / 3)
    # The first goes home; with one in flight there, ceil(1.25 x 2 / 3) = 1 sends the second on.
    assert picked[:2] == [(order[0], True), (order[1], False)]
    assert {key for key, home in picked if not home} <= set(order[1:])
    assert load[order[0]] >= load[order[1]] >= load[order[2]]


def test_a_backend_that_is_out_passes_its_prefixes_to_the_next_on_the_ring():
    ring = Ring(backends(1, 1, 1))
    point = POINTS[1]
    order = [b.key for b in ring.walk(point)]
    usable = [b for b in ring.backends if b.key != order[0]]
    backend, home = bounded_pick(ring, point, usable, lambda key: 0, 125)
    assert (backend.key, home) == (order[1], False)  # type: ignore[union-attr]


def test_the_prefix_is_the_conversation_start_or_the_session_header():
    system = "You are the billing assistant of Acme. " * 60
    body_a, shape_a = chat(system, "what is my balance?")
    body_b, shape_b = chat(system, "cancel my order")
    assert conversation_prefix(shape_a, 1024) == conversation_prefix(
        shape_b, 1024
    )  # the system prompt decides
    assert len(conversation_prefix(shape_a, 1024)) == 1024
    _, short = chat("Be brief.", "what is my balance?")
    _, other = chat("Be brief.", "cancel my order")
    assert conversation_prefix(short, 1024) != conversation_prefix(other, 1024)  # the first turn decides
    a = asked(Algorithm.PREFIX_AFFINITY, shape_a, body_a, {})
    b = asked(Algorithm.PREFIX_AFFINITY, shape_b, body_b, {})
    assert a.point == b.point and a.point is not None
    by_session = asked(Algorithm.PREFIX_AFFINITY, shape_a, body_a, {"x-modelforge-session": "conv-42"})
    also = asked(Algorithm.PREFIX_AFFINITY, short, b"{}", {"x-modelforge-session": "conv-42"})
    assert by_session.point == also.point != a.point
    # Text parts count as text.
    parts = msgspec.json.encode(
        {"model": "m", "messages": [{"role": "system", "content": [{"type": "text", "text": system}]}]}
    )
    assert system[:100] in conversation_prefix(checked("/v1/chat/completions", parts), 1024)


def test_least_outstanding_counts_tokens_every_process_and_what_the_engine_reports():
    body, shape = chat("x" * 4000, max_tokens=100)
    assert estimated_tokens(body, shape) == len(body) // 4 + 100
    assert asked(Algorithm.LEAST_OUTSTANDING, shape, body, {}).point is None
    a, b, c = backends(1, 1, 2)
    router = Router()
    try:
        shared.in_flight_tokens.update({a.key: 3000, b.key: 1000})
        shared.others_tokens.update({b.key: 1500})  # another process's, as its last flush said
        shared.in_flight_tokens[c.key] = 5200  # weight 2: 2,600 per unit; b has 2,500
        assert router.pick([a, b, c], Algorithm.LEAST_OUTSTANDING).key == b.key  # type: ignore[union-attr]
        # b's engine runs two more than the gateways know of: work nobody here sent.
        shared.in_flight[b.key], shared.engine_load[b.key] = 1, 3
        assert shared.outstanding_estimate(b.key) == 2500 + 2 * ENGINE_REQUEST_TOKENS
        assert router.pick([a, b, c], Algorithm.LEAST_OUTSTANDING).key == c.key  # type: ignore[union-attr]
    finally:
        for counter in (shared.in_flight_tokens, shared.others_tokens, shared.in_flight):
            for key in (a.key, b.key, c.key):
                counter.pop(key, None)
        shared.engine_load.clear()


def test_rings_are_built_once_per_candidate_set():
    rings, set_a = Rings(), backends(1, 2)
    assert rings.of(set_a) is rings.of(list(set_a))
    assert rings.of(set_a) is not rings.of(backends(1, 3))
