from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone


class SourceKind(models.TextChoices):
    LOCAL = "local", "Local or NFS path"
    HTTP = "http", "HTTP(S) URL"
    HUGGINGFACE = "huggingface", "Hugging Face repository at a revision"


class ArtifactState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    ACQUIRING = "acquiring", "Acquiring"
    READY = "ready", "Ready"
    QUARANTINED = "quarantined", "Quarantined"
    FAILED = "failed", "Failed"


class Artifact(models.Model):
    """Model weights with their recorded upstream identity and the digests of every file."""

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
    files = models.JSONField(default=list, blank=True, help_text="[{path, size, sha256}] as acquired.")
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

    def set_state(self, state: str, detail: str = "", **fields: Any) -> None:
        """Record a state change and its event row."""
        before = self.state
        self.state = state
        for key, value in fields.items():
            setattr(self, key, value)
        self.save(update_fields=["state", *fields])
        ArtifactEvent.objects.create(artifact=self, from_state=before, to_state=state, detail=detail[:1000])


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


class ReplicaState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    COPYING = "copying", "Copying"
    PRESENT = "present", "Present"
    FAILED = "failed", "Failed"


class Replica(models.Model):
    """An artifact on one node: asked for explicitly, copied by the node's agent, verified, present."""

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
