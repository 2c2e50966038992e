"""Placement: the one function that decides where a model server runs, or refuses by name.

API, admin and dashboard all call ``place``. It never guesses: a node it cannot currently see is not a
candidate, a reading older than the stale limit is not a reading, and every refusal says, node by node,
which check failed with the numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.nodes.choices import Liveness
from apps.nodes.models import GPU, Node
from apps.servers import codes
from apps.servers.choices import HOLDING, ServerState
from apps.servers.models import ModelServer, Reservation, ServerEvent
from apps.servers.profiles import GIB, RuntimeProfile, runtime_profiles
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError
from modelforge.errors import codes as errors


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _wanted(gpus: int, need: float) -> str:
    """``2 GPUs x 40.0 GiB``, or ``4.5 GiB of RAM`` for a CPU server (never "no GPU(s) x ...")."""
    if not gpus:
        return f"{gib(need)} of RAM"
    return f"{gpus} GPU{'s' if gpus > 1 else ''} x {gib(need)}"


@dataclass
class Request:
    """What the operator asked for."""

    name: str
    profile: str
    model: str
    gpus: int = 0
    weights_bytes: int | None = None
    encrypted: bool = False
    node: str | None = None  # pin to one node by name
    artifact: Any = None  # an Artifact: names the model, its size and whether it is encrypted
    existing: ModelServer | None = None  # a failed server placed again (restart, re-place) keeps its identity
    why: str = ""  # recorded in the placing event of a server placed again


@dataclass
class Verdict:
    """One node's answer: whether it fits, and why (or why not), with the numbers.

    The per-GPU numbers are formatted only when the verdict is shown: a decision over thousands of
    GPUs must not spend its time writing sentences nobody reads.
    """

    node: str
    fits: bool
    summary: str
    gpus: list[int] = field(default_factory=list)
    score: tuple[Any, ...] = ()
    units: list[Unit] = field(default_factory=list)
    shown: list[Unit] = field(default_factory=list)

    @property
    def reason(self) -> str:
        if not self.shown:
            return self.summary
        return f"{self.summary}; " + "; ".join(unit.numbers() for unit in self.shown)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "fits": self.fits, "reason": self.reason, "gpus": self.gpus}


class PlacementRefused(ApiError):
    """A refusal with its per-node explanation: ``summary`` and ``verdicts`` as structure (the dashboard
    shows them apart), both also in ``message`` for the envelope."""

    def __init__(self, code: str, summary: str, status: int, verdicts: list[Verdict]) -> None:
        detail = " ".join(f"[{v.node}] {v.reason}." for v in verdicts)
        super().__init__(code, f"{summary} {detail}".strip(), status)
        self.summary = summary
        self.verdicts = verdicts


def _profile(name: str) -> RuntimeProfile:
    profiles = runtime_profiles()
    profile = profiles.get(name)
    if profile is None:
        known = ", ".join(sorted(profiles)) or "none (is config/ mounted?)"
        raise ApiError(codes.UNKNOWN_RUNTIME_PROFILE, f"No runtime profile {name!r}; known: {known}.", 400)
    return profile


def _ineligible_reason(node: Node, profile: RuntimeProfile, now: datetime) -> str | None:
    """Why ``node`` is not even a candidate, or ``None``."""
    if not node.enabled:
        return "disabled"
    state = node.liveness_now
    if state != Liveness.ONLINE:
        return f"{state}" + (" (no heartbeat yet)" if state == Liveness.PENDING else "")
    if node.last_heartbeat_at is None:
        return "no heartbeat recorded"
    age = (now - node.last_heartbeat_at).total_seconds()
    if age > settings.NODE_STALE_AFTER:
        return (
            f"stale telemetry: last heartbeat {age:.0f} s ago, over the {settings.NODE_STALE_AFTER} s limit; "
            "a reading that old is not a reading"
        )
    if node.accelerator != profile.accelerator:
        return f"accelerator {node.accelerator}, profile {profile.name} needs {profile.accelerator}"
    return None


# Headroom of every GPU (or cpu node's RAM) on nodes that may take work right now: eligibility is decided
# in SQL (enabled, online, heartbeat fresher than the stale limit, the right accelerator), and
# reservations of servers not yet reflected in a heartbeat are summed once, joined. ``scope`` narrows the
# reservations read to the nodes asked about (a re-check reads one node's, not the fleet's).
def _pending(scope: str = "") -> str:
    return f"""
SELECT r.gpu_id, r.node_id, SUM(r.bytes)::bigint AS pending
FROM {Reservation._meta.db_table} r
JOIN {ModelServer._meta.db_table} s ON s.id = r.server_id
LEFT JOIN {GPU._meta.db_table} rg ON rg.id = r.gpu_id
JOIN {Node._meta.db_table} rn ON rn.id = r.node_id
WHERE s.state = ANY(%(holding)s)
  AND NOT (s.state = 'running' AND COALESCE(rg.reported_at, rn.last_heartbeat_at) > s.running_at){scope}
GROUP BY r.gpu_id, r.node_id
"""  # noqa: S608


# Eligible now: enabled, online, a heartbeat fresher than the stale limit, the right accelerator.
_ELIGIBLE = """n.enabled AND n.liveness = 'online' AND n.last_heartbeat_at >= %(fresh_after)s
  AND n.accelerator = %(accelerator)s"""

# Every eligible node (a refusal's explanation), or the few named in %(only)s: a separate statement, not
# ``%(only)s IS NULL OR n.id = ANY(...)``, which no index can serve (the planner read the whole fleet to
# re-check one node: 10 ms of a 1,000-node decision).
_ONLY = " AND n.id = ANY(%(only)s::uuid[])"
_ONLY_PENDING = " AND r.node_id = ANY(%(only)s::uuid[])"


def _headroom(gpus: bool, only: bool) -> str:
    """Each unit's numbers (a GPU, or a cpu node's RAM) on eligible nodes, by node name and GPU index."""
    pending = _pending(_ONLY_PENDING if only else "")
    eligible = _ELIGIBLE + (_ONLY if only else "")
    if gpus:
        return f"""
WITH pending AS ({pending})
SELECT n.id, n.name, n.shm_total_bytes, n.models_present,
       g.id, g."index", g.memory_total_bytes, g.memory_used_bytes, COALESCE(p.pending, 0)
FROM {Node._meta.db_table} n
JOIN {GPU._meta.db_table} g ON g.node_id = n.id
LEFT JOIN pending p ON p.gpu_id = g.id
WHERE {eligible}
ORDER BY n.name, g."index"
"""  # noqa: S608
    return f"""
WITH pending AS ({pending})
SELECT n.id, n.name, n.shm_total_bytes, n.models_present,
       NULL, NULL, n.memory_available_bytes, 0, COALESCE(p.pending, 0)
FROM {Node._meta.db_table} n
LEFT JOIN pending p ON p.node_id = n.id AND p.gpu_id IS NULL
WHERE {eligible}
ORDER BY n.name
"""  # noqa: S608


_GPU_HEADROOM = _headroom(gpus=True, only=False)
_RAM_HEADROOM = _headroom(gpus=False, only=False)
_GPU_HEADROOM_OF = _headroom(gpus=True, only=True)
_RAM_HEADROOM_OF = _headroom(gpus=False, only=True)


# The model is on the node: an artifact's replica recorded present (launch checks the books and the node),
# otherwise the node's last report names the model. Seeds: "A remote start is refused outright" with
# model_not_present_on_node; it is decided here, in the ranking statement, not a second later at launch.
_MODEL_PRESENT = """CASE WHEN %(artifact)s::bigint IS NULL THEN n.models_present @> %(model)s::jsonb
  ELSE EXISTS (SELECT 1 FROM artifacts_replica r WHERE r.node_id = n.id
               AND r.artifact_id = %(artifact)s::bigint AND r.state = 'present') END"""


def _best_first(alias: str = "") -> str:
    """Spread: most headroom left first; pack: least; then by name."""
    return f"CASE WHEN %(spread)s THEN -{alias}left_over ELSE {alias}left_over END, {alias}name"


# The ranking, in SQL, so a decision over thousands of GPUs returns a handful of rows: per eligible
# node that holds the model and has the /dev/shm (checked once per node, before its GPUs are joined),
# how many units have the headroom needed and how much headroom the best k of them leave; ordered by
# spread (most left) or pack (least). The same statement returns the best few nodes' units with their
# numbers, for the choice and the explanation: no second round trip, no second pass over the fleet.
def _ranking(gpus: bool, single: bool) -> str:
    if gpus:
        units = f"""
units AS (
    SELECT e.id AS node_id, g."index" AS unit_index,
           g.memory_total_bytes - g.memory_used_bytes - COALESCE(p.pending, 0) AS headroom
    FROM candidates e
    JOIN {GPU._meta.db_table} g ON g.node_id = e.id
    LEFT JOIN pending p ON p.gpu_id = g.id
    -- Reservations only lower headroom: a GPU whose reported headroom is short is out at the scan.
    WHERE g.memory_total_bytes - g.memory_used_bytes >= %(need)s::bigint
)"""  # noqa: S608
        details = f"""
SELECT n.id, n.name, n.shm_total_bytes, n.models_present,
       g.id, g."index", g.memory_total_bytes, g.memory_used_bytes, COALESCE(p.pending, 0)
FROM best b
JOIN {Node._meta.db_table} n ON n.id = b.node_id
JOIN {GPU._meta.db_table} g ON g.node_id = b.node_id
LEFT JOIN pending p ON p.gpu_id = g.id
ORDER BY {_best_first("b.")}, g."index"
"""  # noqa: S608
    else:
        units = """
units AS (
    SELECT e.id AS node_id, 0 AS unit_index,
           COALESCE(e.memory_available_bytes, 0) - COALESCE(p.pending, 0) AS headroom
    FROM candidates e
    LEFT JOIN pending p ON p.node_id = e.id AND p.gpu_id IS NULL
)"""
        details = f"""
SELECT n.id, n.name, n.shm_total_bytes, n.models_present,
       NULL, NULL, n.memory_available_bytes, 0, COALESCE(p.pending, 0)
FROM best b
JOIN {Node._meta.db_table} n ON n.id = b.node_id
LEFT JOIN pending p ON p.node_id = n.id AND p.gpu_id IS NULL
ORDER BY {_best_first("b.")}
"""  # noqa: S608
    # One unit wanted (the common case): a plain aggregate per node. Several: rank each node's fitting
    # units (spread: most headroom first; pack: fullest first) and sum the best k.
    if single:
        per_node = """
per_node AS (
    SELECT node_id, count(*) AS fitting,
           CASE WHEN %(spread)s THEN max(headroom) ELSE min(headroom) END - %(need)s::bigint AS left_over
    FROM units WHERE headroom >= %(need)s::bigint GROUP BY node_id
)"""
    else:
        per_node = """
ranked AS (
    SELECT node_id, headroom,
           row_number() OVER (
               PARTITION BY node_id
               ORDER BY CASE WHEN %(spread)s THEN -headroom ELSE headroom END, unit_index
           ) AS rk
    FROM units WHERE headroom >= %(need)s::bigint
),
per_node AS (
    SELECT node_id, count(*) AS fitting,
           sum(headroom) FILTER (WHERE rk <= %(k)s::bigint) - %(need)s::bigint * %(k)s::bigint AS left_over
    FROM ranked GROUP BY node_id
)"""
    return f"""
WITH pending AS ({_pending()}),
candidates AS (
    SELECT n.id, n.name, n.memory_available_bytes FROM {Node._meta.db_table} n
    WHERE {_ELIGIBLE} AND (%(only)s::uuid[] IS NULL OR n.id = ANY(%(only)s::uuid[]))
      AND COALESCE(n.shm_total_bytes, 0) >= %(shm)s::bigint AND {_MODEL_PRESENT}
),{units},{per_node},
best AS (
    -- The name joins after the aggregate, not carried through the window sort of a multi-GPU ranking.
    SELECT pn.node_id, n.name, pn.left_over
    FROM per_node pn JOIN {Node._meta.db_table} n ON n.id = pn.node_id
    WHERE pn.fitting >= %(k)s::bigint
    ORDER BY {_best_first()}
    LIMIT %(limit)s
){details}"""  # noqa: S608


_RANK_GPUS = _ranking(gpus=True, single=False)


# One GPU wanted (the common case, and the one a fleet's size shows in): the per-node aggregate reads the
# GPU table alone, with no join per GPU row. Only the nodes that hold reservations (a handful: servers
# placed and not yet reflected in a heartbeat) have their GPUs re-read by index with the reservations
# subtracted, and their exact numbers replace the plain ones; the eligible nodes join the 1-row-per-node
# aggregate, not the GPU rows. The same rows as _ranking(gpus=True, single=True), in about two thirds of
# the time at 5,000 nodes (bench/placement/README.md, 2026-11-30). Spread and pack are two statements, so
# each GPU row feeds one aggregate (max or min), not both behind a CASE.
def _ranking_one_gpu(spread: bool) -> str:
    best = "max" if spread else "min"
    raw = "g.memory_total_bytes - g.memory_used_bytes"
    return f"""
WITH pending AS ({_pending()}),
candidates AS (
    SELECT n.id, n.name FROM {Node._meta.db_table} n
    WHERE {_ELIGIBLE} AND (%(only)s::uuid[] IS NULL OR n.id = ANY(%(only)s::uuid[]))
      AND COALESCE(n.shm_total_bytes, 0) >= %(shm)s::bigint AND {_MODEL_PRESENT}
),
reserved_nodes AS (SELECT DISTINCT node_id FROM pending WHERE gpu_id IS NOT NULL),
-- Reported headroom per node, every GPU row read once and joined to nothing. Reservations only lower
-- headroom, so a GPU short of it here is short after them too.
plain AS (
    SELECT g.node_id, count(*) AS fitting, {best}({raw}) AS best
    FROM {GPU._meta.db_table} g WHERE {raw} >= %(need)s::bigint GROUP BY g.node_id
),
-- The nodes with reservations: their GPUs by index, reservations subtracted.
exact AS (
    SELECT g.node_id, count(*) AS fitting, {best}({raw} - COALESCE(p.pending, 0)) AS best
    FROM {GPU._meta.db_table} g LEFT JOIN pending p ON p.gpu_id = g.id
    WHERE g.node_id = ANY(ARRAY(SELECT node_id FROM reserved_nodes))
      AND {raw} - COALESCE(p.pending, 0) >= %(need)s::bigint
    GROUP BY g.node_id
),
per_node AS (
    SELECT c.id AS node_id, c.name,
           CASE WHEN r.node_id IS NULL THEN pl.best ELSE e.best END - %(need)s::bigint AS left_over
    FROM candidates c
    JOIN plain pl ON pl.node_id = c.id
    LEFT JOIN reserved_nodes r ON r.node_id = c.id
    LEFT JOIN exact e ON e.node_id = c.id
    WHERE CASE WHEN r.node_id IS NULL THEN pl.fitting ELSE COALESCE(e.fitting, 0) END >= 1
),
best AS (SELECT node_id, name, left_over FROM per_node ORDER BY {_best_first()} LIMIT %(limit)s)
SELECT n.id, n.name, n.shm_total_bytes, n.models_present,
       g.id, g."index", g.memory_total_bytes, g.memory_used_bytes, COALESCE(p.pending, 0)
FROM best b
JOIN {Node._meta.db_table} n ON n.id = b.node_id
JOIN {GPU._meta.db_table} g ON g.node_id = b.node_id
LEFT JOIN pending p ON p.gpu_id = g.id
ORDER BY {_best_first("b.")}, g."index"
"""  # noqa: S608


_RANK_ONE_GPU = {spread: _ranking_one_gpu(spread) for spread in (True, False)}
_RANK_RAM = _ranking(gpus=False, single=True)

# Only the chosen node's rows are locked, in a statement of its own: under READ COMMITTED a statement's
# snapshot is taken when it starts, so the headroom is re-read in the next statement, which sees every
# reservation committed by whoever held the lock before.
_LOCK_GPUS = f'SELECT id FROM {GPU._meta.db_table} WHERE node_id = %(node)s ORDER BY "index" FOR UPDATE'  # noqa: S608
_LOCK_NODE = f"SELECT id FROM {Node._meta.db_table} WHERE id = %(node)s FOR UPDATE"  # noqa: S608

# How many runner-up nodes a placed server keeps in its explanation (a refusal keeps every node).
EXPLAIN_RUNNERS_UP = 10


@dataclass
class Unit:
    """One GPU of a candidate node (or, for cpu work, the node's RAM) and its headroom."""

    gpu_id: Any
    index: int | None
    total: int
    used: int
    pending: int

    @property
    def headroom(self) -> int:
        return self.total - self.used - self.pending

    def numbers(self) -> str:
        if self.index is None:
            return f"RAM {gib(self.total)} available - {gib(self.pending)} reserved = {gib(self.headroom)}"
        return (
            f"GPU {self.index}: {gib(self.total)} total - {gib(self.used)} used - "
            f"{gib(self.pending)} reserved = {gib(self.headroom)}"
        )


@dataclass
class Candidate:
    node_id: Any
    name: str
    shm_bytes: int
    present: bool  # the model is on this node (a replica recorded present, for an artifact)
    units: list[Unit]


def _replica_nodes(artifact: Any) -> frozenset[Any] | None:
    """The nodes where this artifact's replica is recorded present (the only ones it may go to);
    ``None`` for a server named by its model, whose presence is the node's own report."""
    if artifact is None:
        return None
    from apps.artifacts.models import Replica, ReplicaState

    present = Replica.objects.filter(artifact=artifact, state=ReplicaState.PRESENT)
    return frozenset(present.values_list("node_id", flat=True))


def _candidates(
    cursor: Any,
    profile: RuntimeProfile,
    model: str,
    gpus: int,
    now: datetime,
    only: list[Any] | None,
    replica_nodes: frozenset[Any] | None,
) -> list[Candidate]:
    """Every eligible node's units (``only``: those nodes' units), read in one statement."""
    if only is None:
        sql = _GPU_HEADROOM if gpus else _RAM_HEADROOM
    else:
        sql = _GPU_HEADROOM_OF if gpus else _RAM_HEADROOM_OF
    cursor.execute(
        sql,
        {
            "holding": list(HOLDING),
            "fresh_after": now - timedelta(seconds=settings.NODE_STALE_AFTER),
            "accelerator": profile.accelerator,
            "only": only,
        },
    )
    return _grouped(cursor.fetchall(), model, replica_nodes)


def _grouped(
    rows: list[tuple[Any, ...]], model: str, replica_nodes: frozenset[Any] | None
) -> list[Candidate]:
    """Rows of (node..., unit...) in node order, as one Candidate per node with its units."""
    found: dict[Any, Candidate] = {}
    for node_id, name, shm, models, gpu_id, index, total, used, pending in rows:
        candidate = found.get(node_id)
        if candidate is None:
            # Django's backend hands jsonb to raw cursors as text (the ORM parses it itself).
            reported = json.loads(models) if isinstance(models, str) else (models or [])
            if replica_nodes is not None:
                present = node_id in replica_nodes
            else:
                present = any(isinstance(m, dict) and m.get("name") == model for m in reported)
            candidate = found[node_id] = Candidate(node_id, name, shm or 0, present, [])
        candidate.units.append(Unit(gpu_id, index, total or 0, used or 0, int(pending)))
    return list(found.values())


def _judge(
    candidate: Candidate, profile: RuntimeProfile, gpus: int, need: int, rule: str, model: str
) -> Verdict:
    """Is the model on this node, and does ``need`` fit ``gpus`` times? The verdict carries the numbers."""
    if not candidate.present:
        return Verdict(
            candidate.name,
            False,
            f"{codes.MODEL_NOT_PRESENT_ON_NODE}: {model!r} is not on this node; "
            "replicate the model to that node first",
        )
    if profile.shm_bytes and candidate.shm_bytes < profile.shm_bytes:
        return Verdict(
            candidate.name,
            False,
            f"{codes.INSUFFICIENT_SHARED_MEMORY}: /dev/shm is {gib(candidate.shm_bytes)}, the profile needs "
            f"{gib(profile.shm_bytes)}; the agent's container needs a larger /dev/shm "
            "and must be recreated",
        )
    wanted = max(gpus, 1)
    fits = [u for u in candidate.units if u.headroom >= need]
    if len(fits) < wanted:
        if gpus:
            what = f"{len(fits)} of {len(candidate.units)} GPU(s) have {gib(need)} free, {gpus} needed"
        else:
            what = f"{gib(need)} needed"
        return Verdict(candidate.name, False, f"{what} ({rule})", shown=candidate.units)
    spread = settings.PLACEMENT_STRATEGY == "spread"
    # spread: the units with the most headroom; pack: the fullest units that still fit.
    fits.sort(key=lambda u: (-u.headroom, u.index or 0) if spread else (u.headroom, u.index or 0))
    chosen = fits[:wanted]
    left = sum(u.headroom for u in chosen) - need * wanted
    score = (-left if spread else left, candidate.name)
    where = f"GPU(s) {', '.join(str(u.index) for u in chosen)}" if gpus else "RAM"
    summary = f"fits on {where} (the model is on this node)"
    gpu_indexes = [u.index for u in chosen if u.index is not None]
    return Verdict(candidate.name, True, summary, gpu_indexes, score, chosen, shown=candidate.units)


def _ranking_params(
    profile: RuntimeProfile,
    gpus: int,
    need: int,
    now: datetime,
    only: list[Any] | None,
    model: str,
    artifact: Any,
) -> dict[str, Any]:
    """The ranking statements' parameters."""
    return {
        "holding": list(HOLDING),
        "fresh_after": now - timedelta(seconds=settings.NODE_STALE_AFTER),
        "accelerator": profile.accelerator,
        "only": only,
        "spread": settings.PLACEMENT_STRATEGY == "spread",
        "need": need,
        "k": max(gpus, 1),
        "shm": profile.shm_bytes,
        "model": json.dumps([{"name": model}]),
        # Presence: a replica recorded present for an artifact, else the node reports the model.
        "artifact": artifact.pk if artifact is not None else None,
        "limit": EXPLAIN_RUNNERS_UP + 1,
    }


def place(request: Request, now: datetime | None = None) -> ModelServer:
    """Place ``request`` and record the server as starting, or refuse.

    1. The profile exists; the GPU count suits its accelerator; local-node-only work (GGUF servers,
       encrypted weights) may only go to the local node.
    2. One statement reads the headroom of every GPU (or cpu node's RAM) on eligible nodes: enabled,
       online, a heartbeat fresher than the stale limit (a reading it does not have is not a reading it
       can guess), the right accelerator. Headroom = total - used (which includes external pressure) -
       reservations of servers placed but not yet reflected in a heartbeat.
    3. Per node: the model is present (an artifact's replica recorded present, else the node's report
       names it; seeds: "A remote start is refused outright"), /dev/shm, then the GPUs that fit; then
       spread (most headroom left) or pack (least), per MODELFORGE_PLACEMENT_STRATEGY.
    4. Lock the chosen node's rows, re-read its headroom in a fresh statement and re-check: a
       concurrent placement that got there first makes it move on to the next best node, so GPUs are
       never overcommitted. Reserve, record, and start on commit.
    5. Nothing fits: ``503 NO_ELIGIBLE_NODE`` when no node is eligible, ``409 model_not_present_on_node``
       when no eligible node holds the model (the launch-time presence check stays, second line of
       defence), ``409 CAPACITY_CONSTRAINED``
       (a correct outcome, not a failure) or ``409 insufficient_shared_memory`` otherwise, each with
       every node's reason and numbers.
    """
    now = now or timezone.now()
    profile = _profile(request.profile)
    gpus = request.gpus
    if request.artifact is not None:
        _from_artifact(request)
    if profile.accelerator == "cpu" and gpus:
        raise ApiError("VALIDATION_ERROR", f"Profile {profile.name} runs on the CPU; ask for 0 GPUs.", 400)
    if profile.accelerator == "nvidia" and gpus < 1:
        raise ApiError("VALIDATION_ERROR", f"Profile {profile.name} needs at least 1 GPU.", 400)
    if profile.memory_rule == "weights_factor" and not request.weights_bytes:
        raise ApiError(
            "VALIDATION_ERROR",
            f"Profile {profile.name} sizes memory from the weights; give weights_bytes.",
            400,
        )
    need, rule = profile.memory_need(request.weights_bytes, gpus)
    _apply_local_only(request, profile)

    only = None
    if request.node:
        pinned = Node.objects.filter(name=request.node).values_list("pk", flat=True).first()
        if pinned is None:
            raise ApiError(errors.REFERENCE_NOT_FOUND, f"node: no node is named {request.node!r}.", 400)
        only = [pinned]

    replicas = _replica_nodes(request.artifact)
    with transaction.atomic():
        with connection.cursor() as cursor:
            # 1. The best few nodes, ranked in SQL, with their units' numbers (one statement).
            cursor.execute(
                _RANK_RAM
                if not gpus
                else _RANK_ONE_GPU[settings.PLACEMENT_STRATEGY == "spread"]
                if gpus == 1
                else _RANK_GPUS,
                _ranking_params(profile, gpus, need, now, only, request.model, request.artifact),
            )
            candidates = _grouped(cursor.fetchall(), request.model, replicas)
            verdicts = [_judge(c, profile, gpus, need, rule, request.model) for c in candidates]
            tried: set[str] = set()
            server = _claim(cursor, request, profile, gpus, need, rule, now, candidates, verdicts, tried)
            if server is not None:
                return server
            # 2. Nothing fits, or concurrent placements took every ranked fit: judge every eligible node,
            #    try any fit not tried yet, and otherwise explain the refusal with every node's numbers.
            candidates = _candidates(cursor, profile, request.model, gpus, now, only, replicas)
            verdicts = [_judge(c, profile, gpus, need, rule, request.model) for c in candidates]
            server = _claim(cursor, request, profile, gpus, need, rule, now, candidates, verdicts, tried)
            if server is not None:
                return server
        _refuse(request, profile, gpus, need, rule, verdicts, now)
    raise AssertionError("unreachable")  # pragma: no cover


def _claim(
    cursor: Any,
    request: Request,
    profile: RuntimeProfile,
    gpus: int,
    need: int,
    rule: str,
    now: datetime,
    candidates: list[Candidate],
    verdicts: list[Verdict],
    tried: set[str],
) -> ModelServer | None:
    """Best fit first: lock the node, re-read its headroom in a fresh statement, record if it still fits.

    A node a concurrent placement filled meanwhile keeps its fresh numbers as its verdict.
    """
    for verdict in sorted((v for v in verdicts if v.fits and v.node not in tried), key=lambda v: v.score):
        tried.add(verdict.node)
        candidate = next(c for c in candidates if c.name == verdict.node)
        cursor.execute(_LOCK_GPUS if gpus else _LOCK_NODE, {"node": candidate.node_id})
        fresh = _candidates(
            cursor, profile, request.model, gpus, now, [candidate.node_id], _replica_nodes(request.artifact)
        )
        recheck = _judge(fresh[0], profile, gpus, need, rule, request.model) if fresh else None
        if recheck is not None and recheck.fits:
            return _record(request, profile, gpus, need, rule, fresh[0], recheck, verdicts)
        verdicts[verdicts.index(verdict)] = recheck or Verdict(verdict.node, False, "no longer eligible")
    return None


def _from_artifact(request: Request) -> None:
    """A server of an artifact: its name on nodes, its size, its encryption come from the artifact."""
    from apps.artifacts.models import ArtifactState
    from apps.artifacts.replication import replica_name

    artifact = request.artifact
    if artifact.state != ArtifactState.READY:
        raise ApiError(
            codes.ARTIFACT_NOT_READY,
            f"Artifact {artifact.name} is {artifact.state}; only a ready artifact (every supply-chain check "
            "passed) is served.",
            409,
        )
    request.model = replica_name(artifact)
    request.weights_bytes = request.weights_bytes or artifact.size_bytes
    request.encrypted = request.encrypted or artifact.encrypted


def _apply_local_only(request: Request, profile: RuntimeProfile) -> None:
    """GGUF servers and encrypted weights run on the local node only, refused by their keys otherwise."""
    if profile.local_node_only and profile.engine == "llamacpp":
        key, why = codes.LLAMACPP_REMOTE_UNSUPPORTED, "GGUF servers are local-node only. Deploy locally."
    elif profile.local_node_only:
        key, why = codes.LOCAL_NODE_ONLY, f"Profile {profile.name} is local-node only. Deploy locally."
    elif request.encrypted:
        key, why = (
            codes.ENCRYPTED_WEIGHTS_LOCAL_ONLY,
            "Encrypted weights are local-node only. Deploy locally.",
        )
    else:
        return
    if not settings.LOCAL_NODE:
        raise ApiError(key, f"{why} No local node is configured (MODELFORGE_LOCAL_NODE).", 409)
    if request.node and request.node != settings.LOCAL_NODE:
        raise ApiError(key, f"{why} {request.node} is not the local node ({settings.LOCAL_NODE}).", 409)
    request.node = settings.LOCAL_NODE


def _record(
    request: Request,
    profile: RuntimeProfile,
    gpus: int,
    need: int,
    rule: str,
    candidate: Candidate,
    verdict: Verdict,
    verdicts: list[Verdict],
) -> ModelServer:
    others = sorted((v for v in verdicts if v.node != verdict.node), key=lambda v: (not v.fits, v.score))
    explanation = [verdict.as_dict()] + [v.as_dict() for v in others[:EXPLAIN_RUNNERS_UP]]
    if len(others) > EXPLAIN_RUNNERS_UP:
        explanation.append(
            {
                "node": f"{len(others) - EXPLAIN_RUNNERS_UP} more",
                "fits": None,
                "reason": "not shown",
                "gpus": [],
            }
        )
    placed = {
        "node_id": candidate.node_id,
        "memory_per_unit_bytes": need,
        "memory_rule": rule,
        "placement_explanation": explanation,
    }
    placing = f"placing on {candidate.name}: {verdict.reason}"
    reserved = f"reserved {gib(need)} x {max(gpus, 1)} on {candidate.name}"
    reservations = [
        Reservation(node_id=candidate.node_id, gpu_id=unit.gpu_id, bytes=need) for unit in verdict.units
    ]
    if request.existing is not None:
        # The same server (its clusters and capabilities keep it), on the node chosen now.
        server = request.existing
        server.transition(
            ServerState.PLACING,
            detail=f"{request.why}; {placing}"[:500],
            port=None,
            pid=None,
            running_at=None,  # a restart's back-off resets only after a run of its own (recovery)
            failure_code="",
            failure_message="",
            **placed,
        )
        _reserve(server, reservations)
        server.transition(ServerState.STARTING, detail=reserved)
    else:
        # A new row is created where its first two moves (pending -> placing -> starting, both allowed)
        # would leave it, with both their event rows, in three statements. Nobody can see the row before
        # this transaction commits, so transition()'s compare-and-swap guards nothing here, and the two
        # moves cost 8 round trips (savepoint, update, event, release, twice): over half of a decision's.
        server = ModelServer.objects.create(
            name=request.name,
            artifact=request.artifact,
            profile=profile.name,
            model=request.model,
            weights_bytes=request.weights_bytes,
            gpus_wanted=gpus,
            encrypted=request.encrypted,
            state=ServerState.STARTING,
            **placed,
        )
        _reserve(server, reservations)
        at = server.created_at
        ServerEvent.objects.bulk_create(
            [
                server.transition_event(ServerState.PENDING, ServerState.PLACING, at=at, detail=placing),
                server.transition_event(ServerState.PLACING, ServerState.STARTING, at=at, detail=reserved),
            ]
        )
    from apps.servers.tasks import start_server

    send_on_commit(start_server, str(server.pk))
    return server


def _reserve(server: ModelServer, reservations: list[Reservation]) -> None:
    for reservation in reservations:
        reservation.server = server
    Reservation.objects.bulk_create(reservations)


def _refuse(
    request: Request,
    profile: RuntimeProfile,
    gpus: int,
    need: int,
    rule: str,
    verdicts: list[Verdict],
    now: datetime,
) -> None:
    """Explain, node by node, why nothing fits; ineligible nodes are read only on this path."""
    judged = {v.node for v in verdicts}
    nodes = Node.objects.order_by("name")
    if request.node:
        nodes = nodes.filter(name=request.node)
    for node in nodes.with_liveness().only("name", "enabled", "liveness", "last_heartbeat_at", "accelerator"):
        if node.name not in judged:
            verdicts.append(
                Verdict(node.name, False, _ineligible_reason(node, profile, now) or "not eligible")
            )
    verdicts.sort(key=lambda v: v.node)
    if not judged:
        raise PlacementRefused(
            codes.NO_ELIGIBLE_NODE,
            f"No online, enabled node with a fresh heartbeat and the {profile.accelerator} accelerator"
            + (f" (asked for node {request.node})" if request.node else "")
            + ("; no node is enrolled." if not verdicts else ":"),
            503,
            verdicts,
        )
    eligible = [v for v in verdicts if v.node in judged]
    holding = [v for v in eligible if not v.reason.startswith(codes.MODEL_NOT_PRESENT_ON_NODE)]
    if not holding:
        raise PlacementRefused(
            codes.MODEL_NOT_PRESENT_ON_NODE,
            f"Model {request.model!r} is not on "
            + (f"node {request.node}" if request.node else "any eligible node")
            + ". Replicate the model to that node first. Replication is explicit, never automatic:",
            409,
            verdicts,
        )
    if all(v.reason.startswith(codes.INSUFFICIENT_SHARED_MEMORY) for v in holding):
        raise PlacementRefused(
            codes.INSUFFICIENT_SHARED_MEMORY,
            f"Every candidate's /dev/shm is smaller than the {gib(profile.shm_bytes)} profile {profile.name} "
            "needs. The agent's container needs a larger /dev/shm "
            "and must be recreated:",
            409,
            verdicts,
        )
    raise PlacementRefused(
        codes.CAPACITY_CONSTRAINED,
        f"No node has room for {request.name}: {_wanted(gpus, need)} ({rule}). This is the "
        "scheduler refusing rather than risking an out-of-memory failure, not an error:",
        409,
        verdicts,
    )
