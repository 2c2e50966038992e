"""Placement: the one function that decides where a model server runs, or refuses by name.

API, admin and dashboard all call ``place``. It never guesses: a node it cannot currently see is not a
candidate, a reading older than the stale limit is not a reading, and every refusal says, node by node,
which check failed with the numbers.
"""

from __future__ import annotations

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
from apps.servers.models import ModelServer, Reservation
from apps.servers.profiles import GIB, RuntimeProfile
from modelforge.errors import ApiError


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


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


@dataclass
class Verdict:
    """One node's answer: whether it fits, and why (or why not), with the numbers."""

    node: str
    fits: bool
    reason: str
    gpus: list[int] = field(default_factory=list)
    score: tuple[Any, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "fits": self.fits, "reason": self.reason, "gpus": self.gpus}


class PlacementRefused(ApiError):
    """A refusal with its per-node explanation (also in the message, for the envelope)."""

    def __init__(self, code: str, summary: str, status: int, verdicts: list[Verdict]) -> None:
        detail = " ".join(f"[{v.node}] {v.reason}." for v in verdicts)
        super().__init__(code, f"{summary} {detail}".strip(), status)
        self.verdicts = verdicts


def _profile(name: str) -> RuntimeProfile:
    profile = settings.RUNTIME_PROFILES.get(name)
    if profile is None:
        known = ", ".join(sorted(settings.RUNTIME_PROFILES)) or "none (is config/ mounted?)"
        raise ApiError(codes.UNKNOWN_RUNTIME_PROFILE, f"No runtime profile {name!r}; known: {known}.", 400)
    return profile


def _ineligible_reason(node: Node, profile: RuntimeProfile, now: datetime) -> str | None:
    """Why ``node`` is not even a candidate, or ``None``."""
    if not node.enabled:
        return "disabled"
    if node.liveness != Liveness.ONLINE:
        return f"{node.liveness}" + (" (no heartbeat yet)" if node.liveness == Liveness.PENDING else "")
    age = (now - node.last_heartbeat_at).total_seconds() if node.last_heartbeat_at else None
    if age is None or age > settings.NODE_STALE_AFTER:
        return (
            f"stale telemetry: last heartbeat {age:.0f} s ago, over the {settings.NODE_STALE_AFTER} s limit; "
            "a reading that old is not a reading"
        )
    if node.accelerator != profile.accelerator:
        return f"accelerator {node.accelerator}, profile {profile.name} needs {profile.accelerator}"
    return None


_GPU_HEADROOM = f"""
SELECT g.id, g.node_id, g."index", g.memory_total_bytes, g.memory_used_bytes, g.reported_at,
       COALESCE((
           SELECT SUM(r.bytes) FROM {Reservation._meta.db_table} r
           JOIN {ModelServer._meta.db_table} s ON s.id = r.server_id
           WHERE r.gpu_id = g.id AND s.state = ANY(%(holding)s)
             AND NOT (s.state = 'running' AND g.reported_at > s.running_at)
       ), 0) AS pending
FROM {GPU._meta.db_table} g
WHERE g.node_id = ANY(%(nodes)s)
ORDER BY g.id
"""  # noqa: S608 -- table names are ours

_NODE_HEADROOM = f"""
SELECT n.id, n.memory_available_bytes, n.last_heartbeat_at,
       COALESCE((
           SELECT SUM(r.bytes) FROM {Reservation._meta.db_table} r
           JOIN {ModelServer._meta.db_table} s ON s.id = r.server_id
           WHERE r.node_id = n.id AND r.gpu_id IS NULL AND s.state = ANY(%(holding)s)
             AND NOT (s.state = 'running' AND n.last_heartbeat_at > s.running_at)
       ), 0) AS pending
FROM {Node._meta.db_table} n
WHERE n.id = ANY(%(nodes)s)
ORDER BY n.id
"""  # noqa: S608

# Locks first, in a statement of its own: under READ COMMITTED a statement's snapshot is taken when it
# starts, so a headroom query that waited on these locks would still not see the reservations the
# winner just committed. The next statement takes a fresh snapshot and does.
_LOCK_GPUS = f"SELECT id FROM {GPU._meta.db_table} WHERE node_id = ANY(%(nodes)s) ORDER BY id FOR UPDATE"  # noqa: S608
_LOCK_NODES = f"SELECT id FROM {Node._meta.db_table} WHERE id = ANY(%(nodes)s) ORDER BY id FOR UPDATE"  # noqa: S608


def place(request: Request, now: datetime | None = None) -> ModelServer:
    """Place ``request`` and record the server as starting, or refuse.

    1. The profile exists; the GPU count suits its accelerator; local-node-only work (GGUF servers,
       encrypted weights) may only go to the local node.
    2. Candidates: online, enabled nodes with a fresh heartbeat and the right accelerator. None:
       ``503 NO_ELIGIBLE_NODE``, each node's reason listed.
    3. In one transaction, lock the candidates' GPU rows (or node rows for cpu work) and read each
       GPU's headroom = total - used (which includes external pressure) - reservations of servers
       placed but not yet reflected in a heartbeat. Concurrent placements queue on these locks, so
       they can never overcommit a GPU.
    4. Per node: /dev/shm, then the GPUs that fit. None fits: ``409 CAPACITY_CONSTRAINED`` (a correct
       outcome, not a failure), with every node's numbers.
    5. Prefer nodes that already hold the model (locality), then spread (most headroom left) or pack
       (least), as MODELFORGE_PLACEMENT_STRATEGY says; reserve, record, and start on commit.
    """
    now = now or timezone.now()
    profile = _profile(request.profile)
    gpus = request.gpus
    if profile.accelerator == "cpu" and gpus:
        raise ApiError("VALIDATION_ERROR", f"Profile {profile.name} runs on the CPU; ask for 0 GPUs.", 400)
    if profile.accelerator == "nvidia" and gpus < 1:
        raise ApiError("VALIDATION_ERROR", f"Profile {profile.name} needs at least 1 GPU.", 400)
    need, rule = profile.memory_need(request.weights_bytes, gpus)
    if profile.memory_rule == "weights_factor" and not request.weights_bytes:
        raise ApiError(
            "VALIDATION_ERROR",
            f"Profile {profile.name} sizes memory from the weights; give weights_bytes.",
            400,
        )

    local_only_key = None
    if profile.local_node_only:
        local_only_key = codes.LLAMACPP_REMOTE_UNSUPPORTED
    elif request.encrypted:
        local_only_key = codes.ENCRYPTED_WEIGHTS_LOCAL_ONLY
    if local_only_key:
        why = (
            "GGUF servers are local-node only. Deploy locally."
            if profile.local_node_only
            else ("Encrypted weights are local-node only. Deploy locally.")
        )
        if not settings.LOCAL_NODE:
            raise ApiError(local_only_key, f"{why} No local node is configured (MODELFORGE_LOCAL_NODE).", 409)
        if request.node and request.node != settings.LOCAL_NODE:
            raise ApiError(
                local_only_key, f"{why} {request.node} is not the local node ({settings.LOCAL_NODE}).", 409
            )
        request.node = settings.LOCAL_NODE

    nodes = list(
        Node.objects.order_by("name").only(
            "id",
            "name",
            "enabled",
            "liveness",
            "last_heartbeat_at",
            "accelerator",
            "shm_total_bytes",
            "models_present",
        )
    )
    if request.node:
        nodes = [n for n in nodes if n.name == request.node]
        if not nodes:
            raise ApiError("VALIDATION_ERROR", f"No node is named {request.node!r}.", 400)
    verdicts: list[Verdict] = []
    candidates: list[Node] = []
    for node in nodes:
        reason = _ineligible_reason(node, profile, now)
        if reason:
            verdicts.append(Verdict(node.name, False, reason))
        else:
            candidates.append(node)
    if not candidates:
        raise PlacementRefused(
            codes.NO_ELIGIBLE_NODE,
            f"No online, enabled node with a fresh heartbeat and the {profile.accelerator} accelerator"
            + (f" (asked for node {request.node})" if request.node else "")
            + ("; no node is enrolled." if not nodes else ":"),
            503,
            verdicts,
        )

    with transaction.atomic():
        by_id = {node.pk: node for node in candidates}
        by_name = {node.name for node in candidates}
        fitting: list[Verdict] = []
        with connection.cursor() as cursor:
            params: dict[str, Any] = {"nodes": list(by_id), "holding": list(HOLDING)}
            cursor.execute(_LOCK_GPUS if gpus else _LOCK_NODES, params)
            cursor.execute(_GPU_HEADROOM if gpus else _NODE_HEADROOM, params)
            rows = cursor.fetchall()
        if gpus:
            per_node: dict[Any, list[tuple[Any, ...]]] = {}
            for row in rows:
                per_node.setdefault(row[1], []).append(row)
        choices: dict[str, list[tuple[Any, int]]] = {}
        for node in candidates:
            if profile.shm_bytes and (node.shm_total_bytes or 0) < profile.shm_bytes:
                verdicts.append(
                    Verdict(
                        node.name,
                        False,
                        f"{codes.INSUFFICIENT_SHARED_MEMORY}: /dev/shm is {gib(node.shm_total_bytes or 0)}, "
                        f"the profile needs {gib(profile.shm_bytes)}; the agent's container needs a larger "
                        "/dev/shm and must be recreated",  # noqa: S108 -- a message, not a path we use
                    )
                )
                continue
            local = any(m.get("name") == request.model for m in node.models_present or [])
            if gpus:
                verdict, chosen = _fit_gpus(node, per_node.get(node.pk, []), gpus, need, rule, now, local)
            else:
                row = next(r for r in rows if r[0] == node.pk)
                verdict, chosen = _fit_ram(node, row, need, rule, local)
            verdicts.append(verdict)
            if verdict.fits:
                fitting.append(verdict)
                choices[node.name] = chosen
        if not fitting:
            only = [v for v in verdicts if v.node in {n.name for n in nodes}]
            shm_only = all(
                v.reason.startswith(codes.INSUFFICIENT_SHARED_MEMORY) for v in verdicts if v.node in by_name
            )
            if shm_only:
                raise PlacementRefused(
                    codes.INSUFFICIENT_SHARED_MEMORY,
                    f"Every candidate's /dev/shm is smaller than the {gib(profile.shm_bytes)} profile "
                    f"{profile.name} needs. The agent's container needs a larger /dev/shm "
                    "and must be recreated:",
                    409,
                    only,
                )
            raise PlacementRefused(
                codes.CAPACITY_CONSTRAINED,
                f"No node has room for {request.name}: {gpus or 'no'} GPU(s) x {gib(need)} ({rule}). This is "
                "the scheduler refusing rather than risking an out-of-memory failure, not an error:",
                409,
                only,
            )
        best = min(fitting, key=lambda v: v.score)
        node = next(n for n in candidates if n.name == best.node)
        server = ModelServer.objects.create(
            name=request.name,
            profile=profile.name,
            model=request.model,
            weights_bytes=request.weights_bytes,
            gpus_wanted=gpus,
            encrypted=request.encrypted,
            node=node,
            memory_per_unit_bytes=need,
            memory_rule=rule,
            placement_explanation=[v.as_dict() for v in verdicts],
        )
        server.transition(ServerState.PLACING, detail=f"placing on {node.name}: {best.reason}")
        Reservation.objects.bulk_create(
            [
                Reservation(server=server, node=node, gpu_id=gpu_id, bytes=amount)
                for gpu_id, amount in choices[node.name]
            ]
        )
        server.transition(
            ServerState.STARTING, detail=f"reserved {gib(need)} x {max(gpus, 1)} on {node.name}"
        )
        from apps.servers.tasks import start_server

        transaction.on_commit(lambda: start_server.delay(str(server.pk)))
    return server


def _fit_gpus(
    node: Node, rows: list[tuple[Any, ...]], gpus: int, need: int, rule: str, now: datetime, local: bool
) -> tuple[Verdict, list[tuple[Any, int]]]:
    stale_limit = now - timedelta(seconds=settings.NODE_STALE_AFTER)
    parts, fits = [], []
    for gpu_id, _, index, total, used, reported_at, pending in rows:
        if reported_at < stale_limit:
            parts.append(f"GPU {index}: stale reading")
            continue
        headroom = total - used - pending
        numbers = f"{gib(total)} total - {gib(used)} used - {gib(pending)} reserved = {gib(headroom)}"
        parts.append(f"GPU {index}: {numbers}")
        if headroom >= need:
            fits.append((headroom, index, gpu_id))
    if len(fits) < gpus:
        reason = (
            f"{len(fits)} of {len(rows)} GPU(s) have {gib(need)} free, {gpus} needed ({rule}); "
            + "; ".join(parts)
        )
        return Verdict(node.name, False, reason), []
    strategy = settings.PLACEMENT_STRATEGY
    # spread: the GPUs with the most headroom; pack: the fullest GPUs that still fit.
    fits.sort(key=lambda f: (-f[0], f[1]) if strategy == "spread" else (f[0], f[1]))
    chosen = fits[:gpus]
    left = sum(h for h, _, _ in chosen) - need * gpus
    score = (0 if local else 1, -left if strategy == "spread" else left, node.name)
    reason = (
        f"fits on GPU(s) {', '.join(str(i) for _, i, _ in chosen)}"
        + (" (model already on this node)" if local else "")
        + "; "
        + "; ".join(parts)
    )
    return Verdict(node.name, True, reason, [i for _, i, _ in chosen], score), [
        (g, need) for _, _, g in chosen
    ]


def _fit_ram(
    node: Node, row: tuple[Any, ...], need: int, rule: str, local: bool
) -> tuple[Verdict, list[tuple[Any, int]]]:
    _, available, _, pending = row
    headroom = (available or 0) - pending
    numbers = f"RAM {gib(available or 0)} available - {gib(pending)} reserved = {gib(headroom)}"
    if headroom < need:
        return Verdict(node.name, False, f"{numbers}, {gib(need)} needed ({rule})"), []
    strategy = settings.PLACEMENT_STRATEGY
    left = headroom - need
    score = (0 if local else 1, -left if strategy == "spread" else left, node.name)
    reason = f"fits: {numbers}" + (" (model already on this node)" if local else "")
    return Verdict(node.name, True, reason, [], score), [(None, need)]
