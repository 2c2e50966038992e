"""Artifacts' and replicas' waiting work (``apps.core.work``): an artifact requested and never taken or
acquiring by a worker that died, a replica requested and never started or copying with no progress.
Registered at ``ArtifactsConfig.ready()``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import OuterRef, Subquery
from django.utils import timezone

from apps.artifacts.models import Artifact, ArtifactEvent, ArtifactState, Replica, ReplicaState
from apps.core.work import WATCH_QUIET_S, WORK_CANCELLED, WORK_NOT_WAITING, Kind, Waiting, bound, moved_on
from modelforge.dispatch import send
from modelforge.errors import ApiError


def _artifacts() -> Iterable[Waiting]:
    entered = ArtifactEvent.objects.filter(artifact=OuterRef("pk"), to_state=OuterRef("state")).order_by(
        "-at", "-id"
    )
    rows = Artifact.objects.filter(state__in=(ArtifactState.REQUESTED, ArtifactState.ACQUIRING)).annotate(
        entered_at=Subquery(entered.values("at")[:1])
    )
    for artifact in rows:
        since = artifact.entered_at or artifact.created_at
        if artifact.state == ArtifactState.REQUESTED:
            yield Waiting(
                "artifact",
                str(artifact.pk),
                artifact.name,
                artifact.state,
                "a worker to acquire it",
                since,
                bound("WORK_RESEND_AFTER"),
                bound("WORK_STUCK_AFTER"),
                artifact,
            )
        else:
            yield Waiting(
                "artifact",
                str(artifact.pk),
                artifact.name,
                artifact.state,
                "its acquisition to finish",
                since,
                10**9,
                _acquiring_bound(artifact),
                artifact,
            )


def _acquiring_bound(artifact: Any) -> int:
    """An acquisition whose worker died (its advisory lock free) is stuck now; a live one gets the long
    bound."""
    from apps.artifacts import locks

    return bound("WORK_LONG_TASK_BOUND") if locks.is_acquiring(artifact.pk) else 0


def _resend_artifact(artifact: Any) -> None:
    from apps.artifacts.tasks import acquire

    if artifact.state == ArtifactState.REQUESTED:
        send(acquire, artifact.pk)


def _retry_artifact(artifact: Any) -> None:
    """Retry: a dead acquisition goes back to requested (its partial store folder is replaced)."""
    if artifact.state == ArtifactState.ACQUIRING:
        from apps.artifacts import locks

        if locks.is_acquiring(artifact.pk):
            raise ApiError(WORK_NOT_WAITING, f"Artifact {artifact.name} is being acquired right now.", 409)
        try:
            artifact.transition(
                ArtifactState.REQUESTED, detail="requested again: the process acquiring it is gone"
            )
        except ApiError:
            raise moved_on("artifact", artifact.pk) from None
    _resend_artifact(artifact)


def _fail_artifact(artifact: Any, by: str) -> None:
    fresh = Artifact.objects.get(pk=artifact.pk)
    if fresh.state not in (ArtifactState.REQUESTED, ArtifactState.ACQUIRING):
        raise moved_on("artifact", artifact.pk)
    try:
        fresh.transition(
            ArtifactState.FAILED,
            detail=f"marked failed by {by} while {fresh.state}",
            failure_code=WORK_CANCELLED,
            failure_message=f"marked failed by {by} while {fresh.state}; retry to acquire it again",
        )
    except ApiError:
        raise moved_on("artifact", artifact.pk) from None


def _replicas() -> Iterable[Waiting]:
    for replica in Replica.objects.filter(
        state__in=(ReplicaState.REQUESTED, ReplicaState.COPYING)
    ).select_related("artifact", "node"):
        waits_on = (
            "a worker to start the copy" if replica.state == ReplicaState.REQUESTED else "the node's copy"
        )
        since = replica.progress_at if replica.state == ReplicaState.COPYING else replica.updated_at
        yield Waiting(
            "replica",
            str(replica.pk),
            f"{replica.artifact.name} on {replica.node.name}",
            replica.state,
            waits_on,
            since or replica.requested_at,
            bound("WORK_RESEND_AFTER"),
            bound("WORK_STUCK_AFTER"),
            replica,
        )


def _resend_replica(replica: Any) -> None:
    from apps.artifacts.tasks import replicate

    if replica.state == ReplicaState.REQUESTED:
        send(replicate, replica.pk)


def _look_at_replica(item: Waiting, now: datetime) -> None:
    """A copying replica whose watch went quiet is looked at here: the agent's own report finishes it."""
    from apps.artifacts import replication

    replica = item.row
    if replica.state == ReplicaState.COPYING and (now - replica.updated_at).total_seconds() > WATCH_QUIET_S:
        replication.check(replica)


def _retry_replica(replica: Any) -> None:
    from apps.artifacts import replication

    if replica.state == ReplicaState.COPYING:
        replication.check(replica)  # the agent's report first: it may be done already
        replica.refresh_from_db()
        if replica.state == ReplicaState.COPYING:
            replication.start(replica)  # the agent resumes its copy where it stopped
            replica.refresh_from_db()
    _resend_replica(replica)


def _fail_replica(replica: Any, by: str) -> None:
    reason = f"{WORK_CANCELLED}: marked failed by {by} while {replica.state}"
    try:
        replica.transition(
            ReplicaState.FAILED, detail=reason, by=by, reason=reason, updated_at=timezone.now()
        )
    except ApiError:
        raise moved_on("replica", replica.pk) from None


KINDS = (
    Kind(
        "artifact",
        "Artifacts",
        40,
        _artifacts,
        retry=_retry_artifact,
        fail=_fail_artifact,
        resend=_resend_artifact,
    ),
    Kind(
        "replica",
        "Replicas",
        50,
        _replicas,
        retry=_retry_replica,
        fail=_fail_replica,
        resend=_resend_replica,
        look=_look_at_replica,
    ),
)
