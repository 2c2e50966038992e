"""Embedding spaces, vector stores, consumer aliases and the cutovers that move an alias between spaces."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from django.db import models
from django.utils import timezone

from apps.clusters.models import Capability, ClientCredential
from apps.embedding_migrations.choices import Pooling, Stage


class EmbeddingSpace(models.Model):
    """What a capability's vectors are made in. Two capabilities share a space only if all five match."""

    capability = models.OneToOneField(Capability, on_delete=models.CASCADE, related_name="embedding_space")
    model = models.CharField(max_length=255)
    revision = models.CharField(max_length=100, blank=True)
    dimension = models.PositiveIntegerField()
    normalized = models.BooleanField(help_text="Vectors have unit length (L2).")
    pooling = models.CharField(max_length=16, choices=Pooling.choices, default=Pooling.UNKNOWN)
    recorded_at = models.DateTimeField(default=timezone.now)
    recorded_by = models.CharField(
        max_length=150, help_text="Who or what recorded it (an operator, a probe)."
    )

    class Meta:
        ordering = ["capability__name"]

    def __str__(self) -> str:
        return f"{self.capability.name}: {self.describe()}"

    def identity(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "revision": self.revision,
            "dimension": self.dimension,
            "normalized": self.normalized,
            "pooling": self.pooling,
        }

    @property
    def key(self) -> str:
        """A short, stable name of the space, written beside the vectors in the store."""
        raw = json.dumps(self.identity(), sort_keys=True)
        return "es_" + hashlib.sha256(raw.encode()).hexdigest()[:16]

    def describe(self) -> str:
        norm = "normalised" if self.normalized else "not normalised"
        revision = f"@{self.revision}" if self.revision else ""
        return f"{self.model}{revision}, {self.dimension} dimensions, {norm}, pooling {self.pooling}"

    def same_as(self, other: EmbeddingSpace | None) -> bool:
        return other is not None and self.identity() == other.identity()


class VectorStore(models.Model):
    """An external vector store, reached only through its typed adapter."""

    name = models.CharField(max_length=63, unique=True)
    kind = models.CharField(max_length=32, help_text="The adapter: pgvector.")
    dsn = models.CharField(max_length=500, help_text="Connection string; never shown back.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def adapter(self) -> Any:
        from apps.embedding_migrations.adapters import adapter_for

        return adapter_for(self.kind, self.dsn)


class ConsumerAlias(models.Model):
    """A consumer's stable search name in a store, and the capability its queries are embedded with.

    ``query_capability`` is the name the consumer calls the gateway with; it follows ``capability`` (the
    space of the data behind the alias) and a cutover switches both together.
    """

    store = models.ForeignKey(VectorStore, on_delete=models.PROTECT, related_name="aliases")
    name = models.CharField(max_length=63)
    index = models.CharField(max_length=63, help_text="The index the alias points at, as last recorded.")
    capability = models.ForeignKey(Capability, on_delete=models.PROTECT, related_name="+")
    query_capability = models.OneToOneField(
        Capability, on_delete=models.PROTECT, related_name="alias_following"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["store", "name"]
        constraints = [
            models.UniqueConstraint(fields=["store", "name"], name="embmig_alias_unique_name"),
        ]
        verbose_name_plural = "consumer aliases"

    def __str__(self) -> str:
        return f"{self.store}/{self.name}"


class Cutover(models.Model):
    """One move of an alias from the source capability's space to the target's."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    alias = models.ForeignKey(ConsumerAlias, on_delete=models.PROTECT, related_name="cutovers")
    source_capability = models.ForeignKey(Capability, on_delete=models.PROTECT, related_name="+")
    target_capability = models.ForeignKey(Capability, on_delete=models.PROTECT, related_name="+")
    source_index = models.CharField(max_length=63)
    target_index = models.CharField(max_length=63)
    source_space = models.JSONField(help_text="The source space as recorded when planned.")
    target_space = models.JSONField(help_text="The target space as recorded when planned.")
    same_space = models.BooleanField(help_text="A same-space move needs no reindex.")
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.PLANNED)
    stage_since = models.DateTimeField(default=timezone.now)
    # The run of the current stage: a task does the work only if it claims this token first, so a task
    # delivered again after its worker was killed finds the run claimed and does nothing.
    run_token = models.UUIDField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    interrupted_at = models.DateTimeField(null=True, blank=True)
    failure_code = models.CharField(max_length=64, blank=True)
    failure_message = models.TextField(blank=True)
    failed_in = models.CharField(max_length=16, blank=True, help_text="The stage that failed.")
    batch_size = models.PositiveIntegerField(default=128)
    docs_total = models.PositiveIntegerField(default=0)
    docs_done = models.PositiveIntegerField(default=0)
    cursor = models.CharField(max_length=255, blank=True, help_text="Last document id reindexed.")
    reindex_started_at = models.DateTimeField(null=True, blank=True)
    reindex_seconds = models.FloatField(default=0.0, help_text="Time spent reindexing, over every run.")
    verification = models.JSONField(default=dict, blank=True)
    credential = models.ForeignKey(
        ClientCredential, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias"],
                condition=~models.Q(stage__in=["completed", "rolled_back"]),
                name="embmig_one_open_cutover_per_alias",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.alias}: {self.source_capability} → {self.target_capability}"

    @property
    def interrupted(self) -> bool:
        return self.interrupted_at is not None

    @property
    def rate(self) -> float | None:
        """Documents per second over the reindex so far."""
        if self.docs_done <= 0 or self.reindex_seconds <= 0:
            return None
        return self.docs_done / self.reindex_seconds

    @property
    def seconds_left(self) -> float | None:
        rate = self.rate
        if rate is None or self.stage != Stage.REINDEXING:
            return None
        return max(self.docs_total - self.docs_done, 0) / rate

    @property
    def percent(self) -> float:
        if self.same_space:
            return 100.0 if self.stage in (Stage.READY_TO_CUT, Stage.CUTTING_OVER, Stage.COMPLETED) else 0.0
        if self.docs_total <= 0:
            return 0.0
        return min(100.0, 100.0 * self.docs_done / self.docs_total)


class CutoverEvent(models.Model):
    """A recorded transition or operator action: when, who, why."""

    cutover = models.ForeignKey(Cutover, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    from_stage = models.CharField(max_length=16, blank=True)
    to_stage = models.CharField(max_length=16)
    actor = models.CharField(max_length=150)
    reason = models.TextField()
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_stage or '-'} → {self.to_stage} by {self.actor}"
