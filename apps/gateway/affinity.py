"""Routing that knows the engines: a request's prefix, the consistent-hash ring, and outstanding work.

**prefix_affinity** sends the requests that share a prefix (a tenant's long system prompt, a
conversation's first turns) to the same backend, whose engine still holds that prefix's KV cache and
answers many times faster than one that must compute it again. It is consistent hashing with bounded
loads (Mirrokni, Thorup, Zadimoghaddam, 2017; the scheme of KubeAI's and Ray Serve's prefix routers):

- A request's **prefix key**: the ``X-ModelForge-Session`` header when the client sends one; else the
  first ``MODELFORGE_GATEWAY_PREFIX_CHARS`` characters of its conversation (chat: each message's role and
  text in order, so a long system prompt decides it alone; completions: the prompt; embeddings: the input).
- The **ring**: each backend has ``VNODES_PER_WEIGHT`` points per unit of weight (weights still apply),
  placed by a hash of its key and the point's number only. Every gateway process builds the same ring from
  the same backends, so two processes send a prefix to the same backend with nothing shared at request
  time; a backend that leaves takes only its own points with it, so only its prefixes move.
- **Bounded loads**: a prefix goes to the first backend clockwise from its hash whose requests in flight
  (every process's: this one's exact, the others' as of their last flush) stay within the cap,
  ``ceil(MODELFORGE_GATEWAY_AFFINITY_LOAD_CAP_PCT % x (in flight + 1) x weight / total weight)``; past
  it, the next backend on the ring takes the request. A benched backend, one failing its probe, and one at
  its admission limit are passed over the same way: their prefixes go to the next backend on the ring, and
  come back when they return.

**least_outstanding** sends a request to the backend with the least estimated work in flight per unit of
weight: the tokens of the requests in flight (each estimated as its body's bytes / 4 plus its
``max_tokens``), every process's, plus what the engine itself reports running or waiting beyond what the
gateways sent it (the agent's heartbeat carries the engine's own counts, where the engine exposes them).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from apps.clusters.bindings import Backend

VNODES_PER_WEIGHT = 40  # points per unit of weight: shares within a few per cent of the weights
MAX_VNODES = 4000  # per backend: a weight of 1000 is 100 x 40, not 40,000 points (weights are scaled down)
SESSION_HEADER = "x-modelforge-session"
MAX_SESSION_CHARS = 256
# The estimate of a generation without max_tokens (the engine decides): a typical answer's length.
DEFAULT_GENERATION_TOKENS = 256
RINGS_KEPT = 256  # rings per process (one per candidate set); cleared when full


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def prefix_hash(text: str) -> int:
    """A request prefix's place on the ring."""
    return int.from_bytes(
        hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=8, person=b"mf-prefix").digest(),
        "big",
    )


def conversation_prefix(shape: Any, limit: int) -> str:
    """The first ``limit`` characters of what a request's answer is computed from, in order: what an
    engine's prefix cache holds for it."""
    parts: list[str] = []
    size = 0
    for text in _texts(shape):
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    return "".join(parts)[:limit]


def _texts(shape: Any) -> Iterable[str]:
    messages = getattr(shape, "messages", None)
    if messages is not None:
        for message in messages:
            yield message.role
            yield "\x1f"
            content = message.content
            if isinstance(content, str):
                yield content
            elif content:  # parts: the text of the text parts, the type of the others
                for part in content:
                    yield part.text if isinstance(part.text, str) else part.type
            yield "\x1e"
        return
    for field in ("prompt", "input"):
        value = getattr(shape, field, None)
        if value is None:
            continue
        if isinstance(value, str):
            yield value
        else:
            yield repr(value[:8])  # a list of prompts or token ids: its first items
        return


def estimated_tokens(body: bytes, shape: Any) -> int:
    """A request's work, in tokens: its prompt (the body's bytes / 4, the usual characters per token) and
    what it may generate (its ``max_tokens``; embeddings generate none)."""
    prompt = len(body) // 4
    if hasattr(shape, "input"):
        return prompt
    wanted = getattr(shape, "max_completion_tokens", None) or getattr(shape, "max_tokens", None)
    return prompt + (wanted or DEFAULT_GENERATION_TOKENS)


@dataclass(frozen=True)
class Ask:
    """What a request tells the balancers about itself (made only for the algorithms that use it)."""

    point: int | None = None  # its prefix's place on the ring (prefix_affinity)
    tokens: int = 0  # its estimated work (least_outstanding, and the counts every algorithm keeps)


class Ring:
    """A candidate set's ring: sorted points and the backend of each."""

    __slots__ = ("backends", "owners", "points")

    def __init__(self, backends: list[Backend]) -> None:
        weights = [b.weight for b in backends]
        scale = max(1, math.ceil(max(weights, default=1) * VNODES_PER_WEIGHT / MAX_VNODES))
        placed: list[tuple[int, int]] = []
        for index, backend in enumerate(backends):
            for n in range(max(1, backend.weight * VNODES_PER_WEIGHT // scale) if backend.weight else 0):
                placed.append((_point(f"{backend.key}#{n}"), index))
        placed.sort()
        self.points = [p for p, _ in placed]
        self.owners = [i for _, i in placed]
        self.backends = backends

    def walk(self, point: int) -> Iterable[Backend]:
        """The backends clockwise from ``point``, each once."""
        if not self.points:
            return
        seen: set[int] = set()
        start = bisect.bisect_left(self.points, point)
        size = len(self.points)
        for step in range(size):
            index = self.owners[(start + step) % size]
            if index not in seen:
                seen.add(index)
                yield self.backends[index]
                if len(seen) == len(self.backends):
                    return

    def home(self, point: int) -> Backend | None:
        """The backend that holds ``point``'s prefix when every candidate is usable and none is loaded."""
        return next(iter(self.walk(point)), None)


class Rings:
    """One per process: the ring of each candidate set, built once (a table never changes once built)."""

    def __init__(self) -> None:
        self._rings: dict[tuple[tuple[str, int], ...], Ring] = {}

    def of(self, backends: list[Backend]) -> Ring:
        key = tuple((b.key, b.weight) for b in backends)
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= RINGS_KEPT:
                self._rings.clear()
            ring = self._rings[key] = Ring(backends)
        return ring


def bounded_pick(
    ring: Ring, point: int, choices: list[Backend], load: Any, cap_pct: int
) -> tuple[Backend | None, bool]:
    """The first of ``choices`` clockwise from ``point`` whose load stays within the cap, and whether it
    is the prefix's home (the first backend on the whole ring). ``load(key)``: requests in flight to it,
    every process's. None when no choice is on the ring (the caller falls back)."""
    allowed = {b.key for b in choices}
    total_weight = sum(b.weight for b in choices)
    if not total_weight:
        return None, False
    in_flight = sum(load(b.key) for b in choices)
    factor = cap_pct / 100 * (in_flight + 1) / total_weight
    if ring.points:  # the usual case, home usable and within its cap: no walk
        first_on_ring = ring.backends[ring.owners[bisect.bisect_left(ring.points, point) % len(ring.points)]]
        if first_on_ring.key in allowed and load(first_on_ring.key) + 1 <= math.ceil(
            factor * first_on_ring.weight
        ):
            return first_on_ring, True
    first = True
    for backend in ring.walk(point):
        home, first = first, False
        if backend.key not in allowed:
            continue
        if load(backend.key) + 1 <= math.ceil(factor * backend.weight):
            return backend, home
    # Counts a second old can leave every one past its cap: the least loaded for its weight, then.
    return min(choices, key=lambda b: (load(b.key) / b.weight if b.weight else math.inf, b.key)), False
