"""The cutover engine: plans, operator actions and their refusals, and the watch for silent runs.

Spaces are in ``spaces``, the stage runner (the task's body) in ``runner``, transitions in ``records``.

It decides and records; the store is touched only through the alias's adapter. A stage runs in one
Celery task that claims the cutover's ``run_token`` first: a task delivered again after its worker was
killed finds the run claimed and does nothing. The watch (``watch``) marks a claimed run whose heartbeat
stopped as **interrupted**, raises ``CUTOVER_INTERRUPTED`` and leaves the stage where it is: what the
store holds after a crash cannot be inferred, so an operator reads it (the admin's review page, the API,
the dashboard) and completes, rolls back or retries — each recorded with who and why.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.clusters.models import Capability
from apps.embedding_migrations import codes
from apps.embedding_migrations.adapters.base import AdapterError
from apps.embedding_migrations.choices import FINAL_STAGES, RUNNING_STAGES, Stage
from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace, VectorStore
from apps.embedding_migrations.records import (
    SUBJECT,
    lock_cutover,
    move,
    record_event,
    store_refusal,
    switch_books,
)
from apps.embedding_migrations.runner import revoke_credentials
from apps.embedding_migrations.spaces import reindex_refusal, space_of
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError
from modelforge.errors import codes as error_codes

logger = logging.getLogger(__name__)


logger = logging.getLogger(__name__)


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
        raise store_refusal(exc) from None
    logger.info("alias %s bound to %s (%s) by %s", alias, index, capability.name, actor)
    return alias


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
        record_event(cutover, "", Stage.PLANNED, actor, "planned", {"same_space": same})
    return cutover


def _run(cutover: Cutover, to: str, *, actor: str, reason: str) -> None:
    """Move to a running stage with a fresh run, and send its task once the move is committed."""
    token = uuid.uuid4()
    move(
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
        cutover = lock_cutover(cutover_id)
        if cutover.stage != Stage.PLANNED:
            raise _conflict(cutover, "start", "a planned cutover")
        if cutover.same_space:
            move(cutover, Stage.READY_TO_CUT, actor=actor, reason=f"{reason}; same space, no reindex needed")
        else:
            _run(cutover, Stage.PROVISIONING, actor=actor, reason=reason)
    return cutover


def cut(cutover_id: Any, *, actor: str, reason: str = "cut over") -> Cutover:
    """Swap the alias (and its query name) to the target. REQUIRES_REINDEX unless the target holds the
    data reindexed and verified in the target space, or the spaces are the same."""
    with transaction.atomic():
        cutover = lock_cutover(cutover_id)
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
        cutover = lock_cutover(cutover_id)
        stuck = cutover.interrupted or (
            cutover.stage == Stage.FAILED and cutover.failed_in == Stage.CUTTING_OVER
        )
        if not (cutover.stage in (Stage.CUTTING_OVER, Stage.FAILED) and stuck):
            raise _conflict(cutover, "complete", "an interrupted or failed cut-over")
        try:
            actual = cutover.alias.store.adapter().read_alias_target(cutover.alias.name)
        except AdapterError as exc:
            raise store_refusal(exc) from None
        if actual != cutover.target_index:
            raise ApiError(
                codes.ALIAS_NOT_ON_TARGET,
                f"The store's alias {cutover.alias.name} points at {actual}, not the target "
                f"{cutover.target_index}: retry the stage (it swaps) or roll back.",
                409,
            )
        switch_books(cutover, cutover.target_capability, cutover.target_index)
        move(
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
        cutover = lock_cutover(cutover_id)
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
            raise store_refusal(exc) from None
        switch_books(cutover, cutover.source_capability, cutover.source_index)
        revoke_credentials(cutover)
        move(
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
        cutover = lock_cutover(cutover_id)
        if cutover.stage == Stage.FAILED and cutover.failed_in:
            _run(cutover, cutover.failed_in, actor=actor, reason=reason)
        elif cutover.stage in RUNNING_STAGES and cutover.interrupted:
            _run(cutover, cutover.stage, actor=actor, reason=reason)
        else:
            raise _conflict(cutover, "retry", "an interrupted stage or a failed cutover")
    return cutover


def _interrupt(cutover: Cutover, now: Any, why: str) -> bool:
    """Mark the run interrupted (once), record it, and raise CUTOVER_INTERRUPTED; the stage stays."""
    marked = Cutover.objects.filter(
        pk=cutover.pk, run_token=cutover.run_token, interrupted_at__isnull=True
    ).update(interrupted_at=now)
    if not marked:
        return False
    record_event(cutover, cutover.stage, cutover.stage, "watch", f"interrupted: {why}")
    Alert.objects.raise_alert(
        codes.CUTOVER_INTERRUPTED,
        Severity.CRITICAL,
        SUBJECT,
        str(cutover.pk),
        str(cutover.alias),
        f"Cutover of {cutover.alias} stopped in {cutover.stage}: {why} It stays there: neither a restart "
        "nor an upgrade moves it. Review what the store holds (admin: Embedding migrations → Cutovers → "
        "review) and complete, roll back or retry the stage. See RUNBOOK_MIGRATION_FAILURE.md.",
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
