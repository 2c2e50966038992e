from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils import timezone

from apps.artifacts.choices import ArtifactState, ReplicaState, SourceKind
from apps.artifacts.codes import INVALID_ARTIFACT_STATE, INVALID_REPLICA_STATE
from apps.core.transitions import StatefulModel

# Allowed moves, as acquisition, release, rehydration and the stuck-work watchdog make them:
# acquire (requested or failed -> acquiring -> ready | quarantined | failed; a source refused before the
# fetch quarantines at once), the watchdog (a dead acquisition back to requested; requested or acquiring
# marked failed), release (quarantined -> ready, requested when nothing was fetched yet, or quarantined
# again when a rule still fails), rehydrate (any state but quarantined -> ready | quarantined | failed,
# the same state included: a ready artifact rehydrated is ready again).
ARTIFACT_TRANSITIONS: dict[str, tuple[str, ...]] = {
    ArtifactState.REQUESTED: (
        ArtifactState.ACQUIRING,
        ArtifactState.READY,
        ArtifactState.QUARANTINED,
        ArtifactState.FAILED,
    ),
    ArtifactState.ACQUIRING: (
        ArtifactState.REQUESTED,
        ArtifactState.READY,
        ArtifactState.QUARANTINED,
        ArtifactState.FAILED,
    ),
    ArtifactState.READY: (ArtifactState.READY, ArtifactState.QUARANTINED, ArtifactState.FAILED),
    ArtifactState.QUARANTINED: (ArtifactState.REQUESTED, ArtifactState.READY, ArtifactState.QUARANTINED),
    ArtifactState.FAILED: (
        ArtifactState.ACQUIRING,
        ArtifactState.READY,
        ArtifactState.QUARANTINED,
        ArtifactState.FAILED,
    ),
}


class Artifact(StatefulModel):
    """Model weights with their recorded upstream identity and the digests of every file."""

    TRANSITIONS = ARTIFACT_TRANSITIONS
    INVALID_STATE_CODE = INVALID_ARTIFACT_STATE

    name = models.CharField(max_length=100, unique=True)
    source_kind = models.CharField(max_length=16, choices=SourceKind.choices)
    locator = models.CharField(max_length=1000, help_text="Path, URL, or Hugging Face repo id.")
    revision = models.CharField(max_length=100, blank=True, help_text="The exact upstream revision.")
    expected_sha256 = models.JSONField(
        default=dict, blank=True, help_text="{relative path: sha256} to match."
    )
    licence = models.CharField(max_length=100, blank=True)
    encrypted = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=ArtifactState.choices, default=ArtifactState.REQUESTED)
    format = models.CharField(max_length=32, blank=True)
    files = models.JSONField(
        default=list,
        blank=True,
        help_text="[{path, size, sha256, blake3}] as acquired (older ones: no blake3).",
    )
    size_bytes = models.BigIntegerField(default=0)
    progress_bytes = models.BigIntegerField(default=0)
    store_path = models.CharField(max_length=1000, blank=True)
    checks = models.JSONField(
        default=list, blank=True, help_text="[{rule, outcome, detail}] of the last pass."
    )
    quarantine_rule = models.CharField(max_length=64, blank=True)
    failure_code = models.CharField(max_length=64, blank=True)
    failure_message = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    acquired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    def state_subject(self) -> str:
        return f"Artifact {self.name}"

    def record_transition(self, before: str, to: str, *, at: datetime, detail: str, by: str) -> None:
        ArtifactEvent.objects.create(
            artifact=self, from_state=before, to_state=to, at=at, by=by[:150], detail=detail[:1000]
        )


class ArtifactEvent(models.Model):
    """A state change of an artifact, or an operator's decision about it (who and why)."""

    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    at = models.DateTimeField(default=timezone.now)
    by = models.CharField(max_length=150, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.artifact_id} {self.from_state}->{self.to_state}"


# Allowed moves, as replication and the stuck-work watchdog make them: asked for (again: a requested or
# failed replica is requested anew), started by a worker (copying, or failed when the agent refuses; a
# copying one whose watch went quiet is started again and stays copying), settled by the agent's report
# and the presence check (present or failed), or marked failed by an operator while it waits.
REPLICA_TRANSITIONS: dict[str, tuple[str, ...]] = {
    ReplicaState.REQUESTED: (ReplicaState.REQUESTED, ReplicaState.COPYING, ReplicaState.FAILED),
    ReplicaState.COPYING: (ReplicaState.COPYING, ReplicaState.PRESENT, ReplicaState.FAILED),
    ReplicaState.PRESENT: (),
    ReplicaState.FAILED: (ReplicaState.REQUESTED,),
}


class Replica(StatefulModel):
    """An artifact on one node: asked for explicitly, copied by the node's agent, verified, present."""

    TRANSITIONS = REPLICA_TRANSITIONS
    INVALID_STATE_CODE = INVALID_REPLICA_STATE

    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="replicas")
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="replicas")
    state = models.CharField(max_length=16, choices=ReplicaState.choices, default=ReplicaState.REQUESTED)
    name = models.CharField(max_length=255, help_text="Its name in the node's models directory.")
    done_bytes = models.BigIntegerField(default=0)
    total_bytes = models.BigIntegerField(default=0)
    copy_seconds = models.FloatField(
        null=True, blank=True, help_text="How long the agent took to fetch, verify and place it."
    )
    reason = models.TextField(blank=True)
    requested_by = models.CharField(max_length=150, blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    progress_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the copy last moved forward (the stuck-work bound counts from it).",
    )

    class Meta:
        ordering = ["-requested_at"]
        constraints = [
            models.UniqueConstraint(fields=["artifact", "node"], name="artifacts_one_replica_per_node")
        ]

    def __str__(self) -> str:
        return f"{self.artifact} on {self.node_id} ({self.state})"

    def state_subject(self) -> str:
        return f"Replica #{self.pk} of artifact {self.artifact_id} on node {self.node_id}"

    def record_transition(self, before: str, to: str, *, at: datetime, detail: str, by: str) -> None:
        ReplicaEvent.objects.create(
            replica=self, from_state=before, to_state=to, at=at, by=by[:150], detail=detail[:2000]
        )

    @property
    def bytes_per_second(self) -> float | None:
        if not self.copy_seconds or not self.total_bytes:
            return None
        return self.total_bytes / self.copy_seconds

    @property
    def mib_per_second(self) -> float | None:
        if not self.copy_seconds or not self.total_bytes:
            return None
        return self.total_bytes / 2**20 / self.copy_seconds


class ReplicaEvent(models.Model):
    """A state change of a replica: who asked, or what the worker, the agent or an operator said."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    at = models.DateTimeField(default=timezone.now)
    by = models.CharField(max_length=150, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.replica_id} {self.from_state}->{self.to_state}"
