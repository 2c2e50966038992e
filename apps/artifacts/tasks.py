"""Thin Celery wrappers over artifact acquisition."""

from __future__ import annotations

from celery import shared_task

from apps.artifacts import acquisition
from apps.artifacts.models import Artifact, ArtifactState
from modelforge.dispatch import send


@shared_task(name="artifacts.acquire")
def acquire(artifact_id: int) -> str:
    from apps.artifacts import locks, services
    from apps.core.pglocks import LockHeld

    try:
        with locks.acquiring(artifact_id):  # a second delivery of this task skips while the first runs
            artifact = Artifact.objects.filter(pk=artifact_id).first()
            if artifact is None or artifact.state not in (ArtifactState.REQUESTED, ArtifactState.FAILED):
                return "skipped"
            if services.reacquisition_blocked(artifact):
                # A retry is refused up front (services.retry_refusal); this is a message sent before.
                return "blocked"
            acquisition.acquire(artifact)
            return artifact.state
    except LockHeld:
        return "skipped"


@shared_task(name="artifacts.record_blake3")
def record_blake3(artifact_id: int) -> str:
    """Once per artifact acquired before BLAKE3 digests were recorded, queued by its first replication."""
    from apps.artifacts import locks
    from apps.core.pglocks import LockHeld

    try:
        with locks.acquiring(artifact_id):  # never beside an acquisition, or a second delivery of this
            artifact = Artifact.objects.filter(pk=artifact_id).first()
            if artifact is None:
                return "skipped"
            return f"{len(acquisition.record_blake3(artifact))} recorded"
    except LockHeld:
        return "skipped"


@shared_task(name="artifacts.replicate")
def replicate(replica_id: int) -> str:
    from apps.artifacts import replication
    from apps.artifacts.models import Replica, ReplicaState

    replica = Replica.objects.select_related("artifact", "node").filter(pk=replica_id).first()
    if replica is None or replica.state != ReplicaState.REQUESTED:
        return "skipped"
    if replication.start(replica):
        send(watch_replica, replica_id, countdown=1)
    return "copying"


@shared_task(name="artifacts.watch_replica")
def watch_replica(replica_id: int) -> str:
    """Look once; re-enqueue itself until the replica is present or failed (never blocks a worker)."""
    from apps.artifacts import replication
    from apps.artifacts.models import Replica, ReplicaState

    replica = Replica.objects.select_related("artifact", "node").filter(pk=replica_id).first()
    if replica is None or replica.state != ReplicaState.COPYING:
        return "settled"
    if not replication.check(replica):
        send(watch_replica, replica_id, countdown=1)
        return "copying"
    replica.refresh_from_db()
    return replica.state


@shared_task(name="artifacts.rehydrate")
def rehydrate(artifact_id: int) -> str:
    from modelforge.errors import ApiError

    artifact = Artifact.objects.filter(pk=artifact_id).first()
    if artifact is None:
        return "skipped"
    try:
        acquisition.rehydrate(artifact)
    except ApiError as exc:
        return exc.code
    return artifact.state
