"""The cutover engine: plans, stage runs, refusals, operator actions.

It decides and records; the store is touched only through the alias's adapter. A stage runs in one
Celery task that claims the cutover's ``run_token`` first: a task delivered again after its worker was
killed finds the run claimed and does nothing. The watch (``watch``) marks a claimed run whose heartbeat
stopped as **interrupted**, raises ``CUTOVER_INTERRUPTED`` and leaves the stage where it is: what the
store holds after a crash cannot be inferred, so an operator reads it (the admin's review page, the API,
the dashboard) and completes, rolls back or retries — each recorded with who and why.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.clusters.models import Capability, ClientCredential
from apps.embedding_migrations import codes
from apps.embedding_migrations.adapters.base import AdapterError, Row
from apps.embedding_migrations.models import (
    FINAL_STAGES,
    RUNNING_STAGES,
    ConsumerAlias,
    Cutover,
    CutoverEvent,
    EmbeddingSpace,
    Pooling,
    Stage,
    VectorStore,
)
from apps.servers.models import ModelServer
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError
from modelforge.errors import codes as error_codes

logger = logging.getLogger(__name__)

SUBJECT = "cutover"
VERIFY_SAMPLE = 32
# A re-embedded sample must match what was stored (cosine similarity; rounding of the engine's JSON).
SAME_VECTOR = 0.9999
PROBE_TEXTS = ["modelforge embedding space probe", "a second, different probe text"]
# Names the control plane's own measuring request to a backend (not a client's, never through the gateway).
PROBE_HEADER = "X-ModelForge-Probe"


# --- spaces ----------------------------------------------------------------------------------------------


def space_of(capability: Capability) -> EmbeddingSpace | None:
    """The recorded space of ``capability`` (of the one it follows, for an alias's query name)."""
    target = capability.follows if capability.follows_id else capability
    assert target is not None
    return EmbeddingSpace.objects.filter(capability=target).first()


def _running_backend(capability: Capability) -> tuple[ModelServer, str]:
    from apps.clusters.routing import build_table

    table = build_table()
    for binding in sorted(table.bindings.get(capability.name, []), key=lambda b: b.tier):
        for backend in binding.backends:
            return ModelServer.objects.select_related("artifact").get(pk=backend.key), backend.url
    raise ApiError(
        codes.EMBEDDING_SPACE_UNKNOWN,
        f"{capability.name} has no running backend to measure its embedding space: bind it to a running "
        "server, or declare the space (POST /api/v1/embedding-spaces).",
        409,
    )


def measure_space(capability: Capability, *, actor: str, pooling: str = Pooling.UNKNOWN) -> EmbeddingSpace:
    """Record ``capability``'s space: model and revision from its server, dimension and normalisation
    measured by embedding two probe texts on a running backend."""
    if capability.follows_id:
        raise ApiError(
            error_codes.VALIDATION_ERROR,
            f"{capability.name} follows {capability.follows}: its space is that capability's.",
            400,
        )
    server, url = _running_backend(capability)
    try:
        answer = httpx.post(
            f"{url}/v1/embeddings",
            json={"model": capability.name, "input": PROBE_TEXTS},
            headers={PROBE_HEADER: "embedding-space"},
            timeout=10,
        )
        answer.raise_for_status()
        vectors = [item["embedding"] for item in answer.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ApiError(
            codes.EMBEDDING_SPACE_UNKNOWN,
            f"{capability.name}'s backend {server.name} did not answer an embeddings request "
            f"({type(exc).__name__}); is it an embedding model?",
            409,
        ) from None
    dimension = len(vectors[0]) if vectors else 0
    if dimension == 0 or any(len(v) != dimension for v in vectors):
        raise ApiError(
            codes.EMBEDDING_SPACE_UNKNOWN,
            f"{capability.name}'s backend {server.name} answered vectors of no or mixed dimensions.",
            409,
        )
    normalized = all(abs(_norm(v) - 1.0) < 1e-3 for v in vectors)
    revision = server.artifact.revision if server.artifact_id and server.artifact else ""
    return record_space(
        capability,
        {
            "model": server.model,
            "revision": revision,
            "dimension": dimension,
            "normalized": normalized,
            "pooling": pooling,
        },
        actor=f"probe by {actor}",
    )


def record_space(capability: Capability, identity: dict[str, Any], *, actor: str) -> EmbeddingSpace:
    """Record (or change) a capability's space. Changing it under an alias's data is refused."""
    with transaction.atomic():
        current = EmbeddingSpace.objects.select_for_update().filter(capability=capability).first()
        if current is not None:
            changed = any(getattr(current, k) != v for k, v in identity.items())
            holders = ConsumerAlias.objects.filter(capability=capability)
            moving = Cutover.objects.filter(target_capability=capability).exclude(stage__in=FINAL_STAGES)
            if changed and moving.exists():
                raise ApiError(
                    codes.CUTOVER_IN_PROGRESS,
                    f"{capability.name} is the target of cutover {moving.first().pk}: its space "  # type: ignore[union-attr]
                    f"({current.key}) is what that cutover reindexes into. Roll it back first.",
                    409,
                )
            if changed and holders.exists():
                proposed = EmbeddingSpace(capability=capability, **identity)
                raise ApiError(
                    codes.REQUIRES_REINDEX,
                    f"{capability.name} holds data behind alias "
                    f"{', '.join(str(a) for a in holders)} in space {current.describe()} ({current.key}); "
                    f"recording {proposed.describe()} ({proposed.key}) would put that data under another "
                    "space. Bind a new capability version and cut the alias over to it.",
                    409,
                )
        space, _ = EmbeddingSpace.objects.update_or_create(
            capability=capability, defaults={**identity, "recorded_at": timezone.now(), "recorded_by": actor}
        )
    return space


def reindex_refusal(source: EmbeddingSpace, target: EmbeddingSpace, what: str) -> ApiError:
    return ApiError(
        codes.REQUIRES_REINDEX,
        f"{what}: the data is in space {source.describe()} ({source.key}), the target is "
        f"{target.describe()} ({target.key}). Vectors of different spaces are not comparable: reindex into "
        "the target space and verify it first (start the cutover, then cut over when it is ready_to_cut).",
        409,
    )


def _norm(vector: Sequence[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    na, nb = _norm(a), _norm(b)
    if na == 0 or nb == 0 or len(a) != len(b):
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def _store_refusal(exc: AdapterError) -> ApiError:
    status = 503 if exc.code == codes.STORE_UNAVAILABLE else 409
    return ApiError(exc.code, exc.message, status)


# --- aliases ---------------------------------------------------------------------------------------------


def create_alias(
    *, store: VectorStore, name: str, index: str, capability: Capability, query_capability: str, actor: str
) -> ConsumerAlias:
    """Bind a consumer: the alias ``name`` over ``index`` (which must hold vectors of ``capability``'s
    space), and ``query_capability``, the name the consumer embeds its queries with."""
    space = space_of(capability)
    if space is None:
        raise ApiError(
            codes.EMBEDDING_SPACE_UNKNOWN,
            f"{capability.name}'s embedding space is not recorded: measure it "
            f"(POST /api/v1/embedding-spaces/measure) or declare it first.",
            409,
        )
    try:
        adapter = store.adapter()
        info = adapter.info(index)
        if info.space != space.key:
            held = EmbeddingSpace.objects.filter(capability__embedding_space__isnull=False).all()
            described = next((s.describe() for s in held if s.key == info.space), "another space")
            raise ApiError(
                codes.REQUIRES_REINDEX,
                f"Index {index} holds vectors of space {described} ({info.space}); {capability.name} embeds "
                f"in {space.describe()} ({space.key}). A consumer is never bound to an index of another "
                "space: reindex it with a cutover.",
                409,
            )
        current = adapter.read_alias_target(name)
        if current not in (None, index):
            raise ApiError(
                error_codes.VALIDATION_ERROR,
                f"name: alias {name} already points at {current} in the store, not {index}.",
                400,
            )
        if Capability.objects.filter(name=query_capability).exists():
            raise ApiError(
                error_codes.VALIDATION_ERROR, f"query_capability: {query_capability} is taken.", 400
            )
        with transaction.atomic():
            follower = Capability(
                name=query_capability,
                description=f"Queries of alias {store.name}/{name}; follows its cutovers.",
                follows=capability,
            )
            follower.full_clean()
            follower.save()
            alias = ConsumerAlias.objects.create(
                store=store, name=name, index=index, capability=capability, query_capability=follower
            )
            if current is None:
                adapter.swap_alias(name, index, expected=None)
    except AdapterError as exc:
        raise _store_refusal(exc) from None
    logger.info("alias %s bound to %s (%s) by %s", alias, index, capability.name, actor)
    return alias


# --- planning and transitions ----------------------------------------------------------------------------


def plan(*, alias: ConsumerAlias, target: Capability, actor: str, batch_size: int = 128) -> Cutover:
    source = alias.capability
    if target.pk == source.pk or target.follows_id:
        raise ApiError(
            error_codes.VALIDATION_ERROR,
            f"target_capability: {target.name} is the alias's own capability or a query name.",
            400,
        )
    source_space, target_space = space_of(source), space_of(target)
    for capability, space in ((source, source_space), (target, target_space)):
        if space is None:
            raise ApiError(
                codes.EMBEDDING_SPACE_UNKNOWN,
                f"{capability.name}'s embedding space is not recorded: measure it "
                "(POST /api/v1/embedding-spaces/measure) or declare it first.",
                409,
            )
    assert source_space is not None and target_space is not None
    same = source_space.same_as(target_space)
    open_one = Cutover.objects.filter(alias=alias).exclude(stage__in=FINAL_STAGES).first()
    if open_one is not None:
        raise ApiError(
            codes.CUTOVER_IN_PROGRESS,
            f"Alias {alias} has cutover {open_one.pk} in stage {open_one.stage}: "
            "finish or roll it back first.",
            409,
        )
    cutover_id = uuid.uuid4()
    target_index = alias.index if same else f"{alias.name[:40]}_{cutover_id.hex[:12]}"
    with transaction.atomic():
        cutover = Cutover.objects.create(
            id=cutover_id,
            alias=alias,
            source_capability=source,
            target_capability=target,
            source_index=alias.index,
            target_index=target_index,
            source_space={**source_space.identity(), "key": source_space.key},
            target_space={**target_space.identity(), "key": target_space.key},
            same_space=same,
            batch_size=batch_size,
            created_by=actor,
        )
        _event(cutover, "", Stage.PLANNED, actor, "planned", {"same_space": same})
    return cutover


def _event(
    cutover: Cutover,
    from_stage: str,
    to_stage: str,
    actor: str,
    reason: str,
    detail: dict[str, Any] | None = None,
) -> None:
    CutoverEvent.objects.create(
        cutover=cutover,
        from_stage=from_stage,
        to_stage=to_stage,
        actor=actor,
        reason=reason,
        detail=detail or {},
    )


def _move(cutover: Cutover, to: str, *, actor: str, reason: str, **fields: Any) -> None:
    """Record a transition of a cutover locked by the caller."""
    before = cutover.stage
    cutover.stage = to
    cutover.stage_since = timezone.now()
    for key, value in fields.items():
        setattr(cutover, key, value)
    cutover.save()
    _event(cutover, before, to, actor, reason, {k: str(v) for k, v in fields.items() if k != "verification"})
    if to not in (Stage.FAILED,):
        Alert.objects.clear_for([codes.CUTOVER_FAILED], SUBJECT, str(cutover.pk))
    if cutover.interrupted_at is None:
        Alert.objects.clear_for([codes.CUTOVER_INTERRUPTED], SUBJECT, str(cutover.pk))


def _locked(cutover_id: Any) -> Cutover:
    return Cutover.objects.select_for_update().select_related("alias__store").get(pk=cutover_id)


def _run(cutover: Cutover, to: str, *, actor: str, reason: str) -> None:
    """Move to a running stage with a fresh run, and send its task once the move is committed."""
    token = uuid.uuid4()
    _move(
        cutover,
        to,
        actor=actor,
        reason=reason,
        run_token=token,
        claimed_at=None,
        heartbeat_at=None,
        interrupted_at=None,
        failure_code="",
        failure_message="",
        failed_in="",
    )
    from apps.embedding_migrations.tasks import run_cutover

    send_on_commit(run_cutover, str(cutover.pk), str(token), queue=settings.CUTOVER_QUEUE)


def _conflict(cutover: Cutover, action: str, allowed: str) -> ApiError:
    return ApiError(
        codes.CUTOVER_STAGE_CONFLICT,
        f"Cutover {cutover.pk} is {cutover.stage}{' (interrupted)' if cutover.interrupted else ''}: "
        f"{action} applies to {allowed}.",
        409,
    )


def start(cutover_id: Any, *, actor: str, reason: str = "started") -> Cutover:
    with transaction.atomic():
        cutover = _locked(cutover_id)
        if cutover.stage != Stage.PLANNED:
            raise _conflict(cutover, "start", "a planned cutover")
        if cutover.same_space:
            _move(cutover, Stage.READY_TO_CUT, actor=actor, reason=f"{reason}; same space, no reindex needed")
        else:
            _run(cutover, Stage.PROVISIONING, actor=actor, reason=reason)
    return cutover


def cut(cutover_id: Any, *, actor: str, reason: str = "cut over") -> Cutover:
    """Swap the alias (and its query name) to the target. REQUIRES_REINDEX unless the target holds the
    data reindexed and verified in the target space, or the spaces are the same."""
    with transaction.atomic():
        cutover = _locked(cutover_id)
        source = EmbeddingSpace(**{k: v for k, v in cutover.source_space.items() if k != "key"})
        target = EmbeddingSpace(**{k: v for k, v in cutover.target_space.items() if k != "key"})
        verified = bool(cutover.verification.get("passed"))
        refusal = reindex_refusal(source, target, f"Alias {cutover.alias} cannot be swapped yet")
        if cutover.stage != Stage.READY_TO_CUT:
            before_ready = cutover.stage in (
                Stage.PLANNED,
                Stage.PROVISIONING,
                Stage.REINDEXING,
                Stage.VERIFYING,
            )
            failed_before = cutover.stage == Stage.FAILED and cutover.failed_in != Stage.CUTTING_OVER
            if not cutover.same_space and (before_ready or failed_before):
                raise refusal
            raise _conflict(cutover, "cut", "a cutover that is ready_to_cut")
        if not cutover.same_space and not verified:
            raise refusal
        _run(cutover, Stage.CUTTING_OVER, actor=actor, reason=reason)
    return cutover


def _switch_books(cutover: Cutover, capability: Capability, index: str) -> None:
    """The control plane's half of a swap: the alias's recorded index and space, and its query name."""
    alias = ConsumerAlias.objects.select_for_update().get(pk=cutover.alias_id)
    alias.index, alias.capability = index, capability
    alias.save(update_fields=["index", "capability"])
    Capability.objects.filter(pk=alias.query_capability_id).update(follows=capability)
    from apps.clusters.routing import bump_version

    transaction.on_commit(bump_version)


def store_reading(cutover: Cutover) -> dict[str, Any]:
    """What the adapter reads from the store now: the alias's real target and the indexes' counts."""
    reading: dict[str, Any] = {"read_at": timezone.now().isoformat()}
    try:
        adapter = cutover.alias.store.adapter()
        reading["alias_target"] = adapter.read_alias_target(cutover.alias.name)
        for role, index in (("source", cutover.source_index), ("target", cutover.target_index)):
            if adapter.exists(index):
                info = adapter.info(index)
                reading[role] = {
                    "index": index,
                    "count": info.count,
                    "space": info.space,
                    "dimension": info.dimension,
                }
            else:
                reading[role] = {"index": index, "exists": False}
    except AdapterError as exc:
        reading["error"] = {"code": exc.code, "message": exc.message}
    return reading


def complete(cutover_id: Any, *, actor: str, reason: str) -> Cutover:
    """An operator's completion of a cutover the store shows swapped (after an interruption)."""
    with transaction.atomic():
        cutover = _locked(cutover_id)
        stuck = cutover.interrupted or (
            cutover.stage == Stage.FAILED and cutover.failed_in == Stage.CUTTING_OVER
        )
        if not (cutover.stage in (Stage.CUTTING_OVER, Stage.FAILED) and stuck):
            raise _conflict(cutover, "complete", "an interrupted or failed cut-over")
        try:
            actual = cutover.alias.store.adapter().read_alias_target(cutover.alias.name)
        except AdapterError as exc:
            raise _store_refusal(exc) from None
        if actual != cutover.target_index:
            raise ApiError(
                codes.ALIAS_NOT_ON_TARGET,
                f"The store's alias {cutover.alias.name} points at {actual}, not the target "
                f"{cutover.target_index}: retry the stage (it swaps) or roll back.",
                409,
            )
        _switch_books(cutover, cutover.target_capability, cutover.target_index)
        _move(
            cutover,
            Stage.COMPLETED,
            actor=actor,
            reason=reason,
            interrupted_at=None,
            run_token=None,
            completed_at=timezone.now(),
        )
    return cutover


def roll_back(cutover_id: Any, *, actor: str, reason: str) -> Cutover:
    """Put the alias (in the store and in the books) back on the source; the target index is kept."""
    with transaction.atomic():
        cutover = _locked(cutover_id)
        if cutover.stage in (Stage.COMPLETED, Stage.ROLLED_BACK):
            raise _conflict(cutover, "roll back", "an unfinished cutover")
        if cutover.stage == Stage.CUTTING_OVER and not cutover.interrupted:
            raise _conflict(cutover, "roll back", "a cutover whose swap is not running (wait for it)")
        try:
            adapter = cutover.alias.store.adapter()
            actual = adapter.read_alias_target(cutover.alias.name)
            if actual != cutover.source_index:
                adapter.swap_alias(cutover.alias.name, cutover.source_index, expected=actual)
        except AdapterError as exc:
            raise _store_refusal(exc) from None
        _switch_books(cutover, cutover.source_capability, cutover.source_index)
        _revoke(cutover)
        _move(
            cutover,
            Stage.ROLLED_BACK,
            actor=actor,
            reason=reason,
            interrupted_at=None,
            run_token=None,
            completed_at=timezone.now(),
        )
    return cutover


def retry(cutover_id: Any, *, actor: str, reason: str) -> Cutover:
    """Run the recorded stage again (an interrupted one, or the one that failed)."""
    with transaction.atomic():
        cutover = _locked(cutover_id)
        if cutover.stage == Stage.FAILED and cutover.failed_in:
            _run(cutover, cutover.failed_in, actor=actor, reason=reason)
        elif cutover.stage in RUNNING_STAGES and cutover.interrupted:
            _run(cutover, cutover.stage, actor=actor, reason=reason)
        else:
            raise _conflict(cutover, "retry", "an interrupted stage or a failed cutover")
    return cutover


# --- the stage runner (the task's body) -------------------------------------------------------------------


class LostRun(Exception):
    """The run was taken back (rolled back, retried, marked interrupted): stop touching the store."""


def claim(cutover_id: str, token: str) -> bool:
    now = timezone.now()
    return bool(
        Cutover.objects.filter(pk=cutover_id, run_token=token, claimed_at__isnull=True).update(
            claimed_at=now, heartbeat_at=now
        )
    )


def _beat(cutover: Cutover, **fields: Any) -> None:
    """Record progress; raises LostRun when the run is no longer this one's."""
    updated = Cutover.objects.filter(
        pk=cutover.pk, run_token=cutover.run_token, interrupted_at__isnull=True
    ).update(heartbeat_at=timezone.now(), **fields)
    if not updated:
        raise LostRun()


class Pulse:
    """Beats the run's heartbeat from a thread while one long store statement runs (an HNSW build, a
    slow batch); it dies with the process, so a killed worker still goes silent."""

    def __init__(self, cutover_id: str, token: str) -> None:
        self.cutover_id, self.token = cutover_id, token
        self.stop = threading.Event()
        self.every = max(1.0, settings.CUTOVER_STALL_AFTER / 4)
        self.thread = threading.Thread(target=self._beat, name=f"cutover-pulse-{cutover_id}", daemon=True)

    def __enter__(self) -> Pulse:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _beat(self) -> None:
        try:
            while not self.stop.wait(self.every):
                try:
                    Cutover.objects.filter(
                        pk=self.cutover_id, run_token=self.token, interrupted_at__isnull=True
                    ).update(heartbeat_at=timezone.now())
                except DatabaseError:
                    close_old_connections()
        finally:
            connection.close()


def run(cutover_id: str, token: str) -> str:
    """Run the cutover's stage and the ones after it up to ready_to_cut (or completed, for a cut)."""
    if not claim(cutover_id, token):
        logger.info("cutover %s run %s already claimed or replaced: nothing to do", cutover_id, token)
        return "not claimed"
    cutover = Cutover.objects.select_related("alias__store", "target_capability").get(pk=cutover_id)
    try:
        with Pulse(cutover_id, token), cutover.alias.store.adapter() as adapter:
            while True:
                if cutover.stage == Stage.PROVISIONING:
                    _provision(cutover, adapter)
                    _advance(cutover, Stage.REINDEXING, "provisioned")
                elif cutover.stage == Stage.REINDEXING:
                    _reindex(cutover, adapter)
                    _advance(cutover, Stage.VERIFYING, "reindexed")
                elif cutover.stage == Stage.VERIFYING:
                    if not _verify(cutover, adapter):
                        return _fail(cutover, codes.VERIFICATION_FAILED, _verification_summary(cutover))
                    _advance(cutover, Stage.READY_TO_CUT, "verified")
                    return Stage.READY_TO_CUT
                elif cutover.stage == Stage.CUTTING_OVER:
                    _cut_over(cutover, adapter)
                    return Stage.COMPLETED
                else:
                    return str(cutover.stage)
    except LostRun:
        logger.info("cutover %s: run %s was taken back; stopped", cutover_id, token)
        return "lost"
    except AdapterError as exc:
        return _fail(cutover, exc.code, exc.message)
    except EmbeddingFailed as exc:
        return _fail(cutover, codes.EMBEDDING_FAILED, str(exc))
    finally:
        _revoke(cutover)


def _advance(cutover: Cutover, to: str, reason: str) -> None:
    with transaction.atomic():
        locked = _locked(cutover.pk)
        if locked.run_token != cutover.run_token or locked.interrupted:
            raise LostRun()
        _move(locked, to, actor="worker", reason=reason, heartbeat_at=timezone.now())
    cutover.refresh_from_db()


def _fail(cutover: Cutover, code: str, message: str) -> str:
    with transaction.atomic():
        locked = _locked(cutover.pk)
        if locked.run_token != cutover.run_token or locked.interrupted:
            return "lost"
        stage = locked.stage
        _move(
            locked,
            Stage.FAILED,
            actor="worker",
            reason=f"{code}: {message}",
            failure_code=code,
            failure_message=message,
            failed_in=stage,
            run_token=None,
        )
        Alert.objects.raise_alert(
            codes.CUTOVER_FAILED,
            Severity.WARNING,
            SUBJECT,
            str(locked.pk),
            str(locked.alias),
            f"Cutover of {locked.alias} failed in {stage}: [{code}] {_braces(message)} "
            "The alias still points where the "
            "store says (see the cutover's page); retry the stage or roll back.",
        )
    return Stage.FAILED


def _provision(cutover: Cutover, adapter: Any) -> None:
    adapter.create_target(
        cutover.target_index,
        dimension=int(cutover.target_space["dimension"]),
        space=cutover.target_space["key"],
    )
    _beat(cutover, docs_total=adapter.count(cutover.source_index))


class EmbeddingFailed(Exception):
    pass


def _braces(text: str) -> str:
    """Alert messages are templates (``{name}``): a backend's JSON in one is escaped."""
    return text.replace("{", "{{").replace("}", "}}")


# A credential minted a moment ago reaches the gateway's routing table within a few seconds.
NEW_CREDENTIAL_GRACE_S = 15.0


def gateway_base() -> str:
    """MODELFORGE_GATEWAY_URL, with or without a trailing ``/v1``."""
    base = str(settings.GATEWAY_URL).rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class GatewayEmbedder:
    """Embeds through the gateway with a credential scoped to exactly the target capability, so
    placement, balancing and scopes apply to the reindex like to any client."""

    def __init__(self, capability: str, secret: str) -> None:
        self.capability = capability
        self.born = time.monotonic()
        self.client = httpx.Client(
            base_url=gateway_base(),
            headers={"Authorization": f"Bearer {secret}"},
            timeout=httpx.Timeout(60.0, connect=5.0),
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        last = ""
        attempt = 0
        while attempt < 4:
            try:
                answer = self.client.post(
                    "/v1/embeddings", json={"model": self.capability, "input": list(texts)}
                )
            except httpx.HTTPError as exc:
                last = f"the gateway could not be reached ({type(exc).__name__})"
            else:
                if answer.status_code == 200:
                    data = sorted(answer.json()["data"], key=lambda item: item["index"])
                    if len(data) != len(texts):
                        raise EmbeddingFailed(f"asked for {len(texts)} vectors, got {len(data)}")
                    return [item["embedding"] for item in data]
                last = f"HTTP {answer.status_code}: {answer.text[:300]}"
                if answer.status_code == 401 and time.monotonic() - self.born < NEW_CREDENTIAL_GRACE_S:
                    time.sleep(0.25)  # not in the gateway's table yet
                    continue
                if answer.status_code < 500 and answer.status_code != 429:
                    break
            time.sleep(min(2**attempt, 8))
            attempt += 1
        raise EmbeddingFailed(f"the gateway did not embed a batch for {self.capability}: {last}")

    def close(self) -> None:
        self.client.close()


def _mint(cutover: Cutover) -> str:
    _revoke(cutover)
    credential, plain = ClientCredential.objects.mint(
        name=f"cutover {cutover.pk} reindex", scopes=[cutover.target_capability.name]
    )
    Cutover.objects.filter(pk=cutover.pk).update(credential=credential)
    cutover.credential = credential
    return plain


def _revoke(cutover: Cutover) -> None:
    for credential in ClientCredential.objects.filter(
        name=f"cutover {cutover.pk} reindex", revoked_at__isnull=True
    ):
        credential.revoke()


def _reindex(cutover: Cutover, adapter: Any) -> None:
    """Re-embed every source document into the target, batch by batch, from the recorded cursor."""
    embedder = GatewayEmbedder(cutover.target_capability.name, _mint(cutover))
    dimension = int(cutover.target_space["dimension"])
    started = timezone.now()
    _beat(cutover, reindex_started_at=cutover.reindex_started_at or started)
    try:
        cursor = cutover.cursor or None
        while True:
            began = time.monotonic()
            documents = adapter.read_documents(cutover.source_index, after=cursor, limit=cutover.batch_size)
            if not documents:
                break
            vectors = embedder.embed([d.content for d in documents])
            bad = next((v for v in vectors if len(v) != dimension), None)
            if bad is not None:
                raise EmbeddingFailed(
                    f"the gateway answered a vector of {len(bad)} dimensions; "
                    f"the target space has {dimension}"
                )
            adapter.write_vectors(
                cutover.target_index,
                [Row(d.id, d.content, v) for d, v in zip(documents, vectors, strict=True)],
            )
            cursor = documents[-1].id
            _beat(
                cutover,
                cursor=cursor,
                docs_done=F("docs_done") + len(documents),
                reindex_seconds=F("reindex_seconds") + (time.monotonic() - began),
            )
    finally:
        embedder.close()
        _revoke(cutover)


def _verify(cutover: Cutover, adapter: Any) -> bool:
    """Counts, dimension, norms, a re-embedded sample, and sample queries through a verification alias."""
    target = cutover.target_space
    source_count = adapter.count(cutover.source_index)
    info = adapter.info(cutover.target_index)
    checks: dict[str, Any] = {
        "count": {"source": source_count, "target": info.count, "passed": source_count == info.count},
        "dimension": {
            "expected": target["dimension"],
            "index": info.dimension,
            "passed": info.dimension == target["dimension"] and info.space == target["key"],
        },
    }
    sample = adapter.sample(cutover.target_index, n=min(VERIFY_SAMPLE, info.count), seed=7)
    if target["normalized"]:
        off = [r.id for r in sample if abs(_norm(r.embedding) - 1.0) > 1e-3]
        checks["norm"] = {"checked": len(sample), "not_unit": off[:10], "passed": not off}
    embedder = GatewayEmbedder(cutover.target_capability.name, _mint(cutover))
    try:
        fresh = embedder.embed([r.content for r in sample]) if sample else []
    finally:
        embedder.close()
        _revoke(cutover)
    differing = [r.id for r, v in zip(sample, fresh, strict=True) if _cosine(r.embedding, v) < SAME_VECTOR]
    checks["re_embedded"] = {"checked": len(sample), "differing": differing[:10], "passed": not differing}
    _beat(cutover)
    probe_alias = f"mfv_{cutover.pk.hex[:20]}"
    missed: list[str] = []
    try:
        adapter.swap_alias(probe_alias, cutover.target_index, expected=adapter.read_alias_target(probe_alias))
        for row in sample[:8]:
            hits = adapter.search(probe_alias, row.embedding, space=target["key"], k=3)
            if not hits or row.id not in {h.id for h in hits}:
                missed.append(row.id)
    finally:
        adapter.drop_alias(probe_alias)
    checks["queries"] = {"checked": min(len(sample), 8), "missed": missed, "passed": not missed}
    passed = all(c["passed"] for c in checks.values())
    _beat(cutover, verification={"passed": passed, "checks": checks, "at": timezone.now().isoformat()})
    cutover.verification = {"passed": passed, "checks": checks}
    return passed


def _verification_summary(cutover: Cutover) -> str:
    failed = [name for name, c in cutover.verification.get("checks", {}).items() if not c["passed"]]
    return f"verification failed: {', '.join(failed)} (details on the cutover's page)."


def _cut_over(cutover: Cutover, adapter: Any) -> None:
    """Swap the store's alias (compare-and-swap from the source), then the books, in that order; a crash
    between the two leaves the store swapped and the stage cutting_over: the review shows it."""
    actual = adapter.read_alias_target(cutover.alias.name)
    if actual != cutover.target_index:
        adapter.swap_alias(cutover.alias.name, cutover.target_index, expected=cutover.source_index)
    _beat(cutover)
    with transaction.atomic():
        locked = _locked(cutover.pk)
        if locked.run_token != cutover.run_token or locked.interrupted:
            raise LostRun()
        _switch_books(locked, locked.target_capability, locked.target_index)
        _move(locked, Stage.COMPLETED, actor="worker", reason="cut over", completed_at=timezone.now())
    cutover.refresh_from_db()


# --- the watch -------------------------------------------------------------------------------------------


def _interrupt(cutover: Cutover, now: Any, why: str) -> bool:
    """Mark the run interrupted (once), record it, and raise CUTOVER_INTERRUPTED; the stage stays."""
    marked = Cutover.objects.filter(
        pk=cutover.pk, run_token=cutover.run_token, interrupted_at__isnull=True
    ).update(interrupted_at=now)
    if not marked:
        return False
    _event(cutover, cutover.stage, cutover.stage, "watch", f"interrupted: {why}")
    Alert.objects.raise_alert(
        codes.CUTOVER_INTERRUPTED,
        Severity.CRITICAL,
        SUBJECT,
        str(cutover.pk),
        str(cutover.alias),
        _braces(
            f"Cutover of {cutover.alias} stopped in {cutover.stage}: {why} It stays there: neither a restart "
            "nor an upgrade moves it. Review what the store holds (admin: Embedding migrations → Cutovers → "
            "review) and complete, roll back or retry the stage. See RUNBOOK_MIGRATION_FAILURE.md."
        ),
    )
    return True


def watch(now: Any = None) -> dict[str, int]:
    """Mark silent runs interrupted (and alert); send again a run no worker ever claimed."""
    now = now or timezone.now()
    stall = timedelta(seconds=settings.CUTOVER_STALL_AFTER)
    counts = {"interrupted": 0, "resent": 0}
    for cutover in Cutover.objects.filter(
        stage__in=RUNNING_STAGES, interrupted_at__isnull=True
    ).select_related("alias__store"):
        if cutover.claimed_at is None and cutover.stage_since < now - timedelta(
            seconds=settings.WORK_STUCK_AFTER
        ):
            _interrupt(
                cutover,
                now,
                f"no worker took its run for {settings.WORK_STUCK_AFTER} s (is a worker consuming the "
                f"queue {settings.CUTOVER_QUEUE!r}?). Nothing touched the store: "
                "retry it once a worker runs.",
            )
            counts["interrupted"] += 1
            continue
        if cutover.claimed_at is None:
            if cutover.stage_since < now - stall and cutover.run_token is not None:
                # Never claimed: no worker touched the store for this run, so sending it again is safe.
                from apps.embedding_migrations.tasks import run_cutover

                send_on_commit(
                    run_cutover, str(cutover.pk), str(cutover.run_token), queue=settings.CUTOVER_QUEUE
                )
                counts["resent"] += 1
            continue
        if cutover.heartbeat_at is not None and cutover.heartbeat_at >= now - stall:
            continue
        silent_since = f"{cutover.heartbeat_at:%Y-%m-%d %H:%M:%S}" if cutover.heartbeat_at else "its start"
        if _interrupt(
            cutover,
            now,
            f"its worker went silent at {silent_since} UTC: "
            f"no progress for {settings.CUTOVER_STALL_AFTER} s.",
        ):
            counts["interrupted"] += 1
    return counts
