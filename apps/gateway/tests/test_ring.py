"""The prefix-affinity ring (apps/gateway/affinity.py), beyond test_affinity.py: another interpreter builds
the same ring, weight 0 has no place on it, a backend leaving or joining moves only its own prefixes,
bounded loads follow the cap request by request (weights included), and what a prefix is made of."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections import Counter
from fractions import Fraction

from apps.clusters.bindings import Backend
from apps.gateway.affinity import Ring, bounded_pick, conversation_prefix, prefix_hash
from apps.gateway.shapes import checked
from tests.fixtures import PYTHON, ROOT

PREFIXES = [f"tenant {n}: you are the assistant of shop {n * 7919 % 100003}" for n in range(20000)]


def backends(weights: dict[str, int]) -> list[Backend]:
    return [
        Backend(key, f"pool/{key}", f"http://127.0.0.1:{9000 + i}", weight)
        for i, (key, weight) in enumerate(weights.items())
    ]


def homes(ring: Ring, prefixes: list[str] = PREFIXES) -> list[str]:
    found = []
    for text in prefixes:
        home = ring.home(prefix_hash(text))
        assert home is not None
        found.append(home.key)
    return found


def test_every_process_builds_the_same_ring_from_the_same_backends():
    """Another interpreter (its own string-hash seed), the backends in another order: the same homes."""
    weights = {"17": 1, "4": 2, "230": 1}
    here = homes(Ring(backends(weights)), PREFIXES[:2000])
    script = (
        "import json, sys, django; django.setup()\n"
        "from apps.clusters.bindings import Backend\n"
        "from apps.gateway.affinity import Ring, prefix_hash\n"
        "weights = json.loads(sys.argv[1])\n"
        "ring = Ring([Backend(k, k, 'http://x', w) for k, w in reversed(list(weights.items()))])\n"
        "print(json.dumps([ring.home(prefix_hash(p)).key for p in json.loads(sys.stdin.read())]))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", DJANGO_SETTINGS_MODULE="modelforge.settings")
    done = subprocess.run(
        [PYTHON, "-c", script, json.dumps(weights)],
        input=json.dumps(PREFIXES[:2000]),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == here
    # And in this process, built again from the backends in another order.
    assert homes(Ring(list(reversed(backends(weights)))), PREFIXES[:2000]) == here


def test_weight_zero_has_no_place_on_the_ring():
    shares = Counter(homes(Ring(backends({"a": 1, "b": 2, "z": 0})), PREFIXES[:3000]))
    assert "z" not in shares and shares["b"] > shares["a"] > 0
    assert Ring(backends({"z": 0})).home(prefix_hash("anything")) is None


def test_a_backend_joining_takes_prefixes_only_for_itself():
    before = Ring(backends({"a": 1, "b": 1}))
    after = Ring(backends({"a": 1, "b": 1, "c": 1}))
    changed = Counter(
        (x, y)
        for x, y in zip(homes(before, PREFIXES[:5000]), homes(after, PREFIXES[:5000]), strict=True)
        if x != y
    )
    assert changed and all(to == "c" for _, to in changed)


def cap(in_flight: int, weight: int, total_weight: int, pct: int = 125) -> int:
    return math.ceil(Fraction(pct, 100) * (in_flight + 1) * weight / total_weight)


def test_bounded_loads_pass_a_full_home_to_the_next_on_the_ring_and_none_passes_the_cap():
    pool = backends({"a": 1, "b": 1, "c": 1})
    ring = Ring(pool)
    point = prefix_hash(PREFIXES[7])
    order = [b.key for b in ring.walk(point)]
    load: Counter[str] = Counter()
    sent = []
    for in_flight in range(11):
        backend, home = bounded_pick(ring, point, pool, load.__getitem__, 125)
        assert backend is not None
        assert load[backend.key] + 1 <= cap(in_flight, 1, 3)
        assert home == (backend.key == order[0])
        load[backend.key] += 1
        sent.append(backend.key)
    assert sent == [order[i] for i in (0, 1, 0, 1, 0, 1, 2, 0, 1, 0, 1)]


def test_bounded_loads_weigh_the_cap():
    pool = backends({"big": 3, "small": 1})
    ring = Ring(pool)
    for text in PREFIXES[:50]:
        point = prefix_hash(text)
        load: Counter[str] = Counter()
        for in_flight in range(12):
            backend, _ = bounded_pick(ring, point, pool, load.__getitem__, 125)
            assert backend is not None
            assert load[backend.key] + 1 <= cap(in_flight, backend.weight, 4)
            load[backend.key] += 1
        assert load["big"] > load["small"]


def chat(*messages: tuple[str, str]) -> object:
    body = {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}
    return checked("/v1/chat/completions", json.dumps(body).encode())


def test_a_long_system_prompt_decides_a_chat_prefix():
    system = "You answer for the shop. " * 60  # 1,500 characters
    one = conversation_prefix(chat(("system", system), ("user", "hello")), 1024)
    two = conversation_prefix(chat(("system", system), ("user", "something else")), 1024)
    assert one == two and len(one) == 1024
    short = conversation_prefix(chat(("system", "Be brief."), ("user", "hello")), 1024)
    other = conversation_prefix(chat(("system", "Be brief."), ("user", "goodbye")), 1024)
    assert short != other  # short: the first turns are part of it
    # The roles count: the same text from another role is another conversation.
    assert conversation_prefix(chat(("user", "Be brief.")), 1024) != conversation_prefix(
        chat(("system", "Be brief.")), 1024
    )


def test_completions_and_embeddings_prefixes_are_their_prompt_and_input():
    text = "x" * 2000
    prompt = checked("/v1/completions", json.dumps({"model": "m", "prompt": text}).encode())
    embedding = checked("/v1/embeddings", json.dumps({"model": "m", "input": text + " tail"}).encode())
    assert conversation_prefix(prompt, 1024) == text[:1024] == conversation_prefix(embedding, 1024)
