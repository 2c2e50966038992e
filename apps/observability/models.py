"""Monitoring history, kept behind the ``observability`` database alias so that it can fail alone
(``OBSERVABILITY_DEGRADED``). Nothing that serves, schedules or recovers reads these tables: they hold
copies of readings whose authoritative, current values live with their domain (``nodes.GPU``)."""

from __future__ import annotations

from django.db import models


class TelemetrySample(models.Model):
    """One GPU's reading at one moment, copied from the node's last report by the sampling task.

    No foreign key: the node lives in the authoritative database, which may be another server."""

    node_id = models.UUIDField(db_index=False)
    node_name = models.CharField(max_length=63)
    gpu_index = models.PositiveSmallIntegerField()
    at = models.DateTimeField()
    reported_at = models.DateTimeField()
    memory_total_bytes = models.BigIntegerField()
    memory_used_bytes = models.BigIntegerField()
    memory_managed_bytes = models.BigIntegerField()
    utilization_percent = models.PositiveSmallIntegerField()
    temperature_c = models.SmallIntegerField()

    class Meta:
        ordering = ["node_id", "gpu_index", "at"]
        indexes = [
            models.Index(fields=["node_id", "at"], name="observ_telemetry_node_at"),
            models.Index(fields=["at"], name="observ_telemetry_at"),
        ]

    def __str__(self) -> str:
        return f"{self.node_name} GPU {self.gpu_index} at {self.at:%Y-%m-%d %H:%M:%S}"


class TrafficSample(models.Model):
    """Requests and errors one backend (a model server) served through the gateway in one minute,
    rolled up from the routers' shared counters (Redis keeps them an hour, for the drift window)."""

    backend = models.CharField(max_length=64, help_text="The model server's id.")
    minute = models.DateTimeField()
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-minute", "backend"]
        constraints = [
            models.UniqueConstraint(fields=["backend", "minute"], name="observ_traffic_one_per_minute")
        ]
        indexes = [models.Index(fields=["minute"], name="observ_traffic_minute")]

    def __str__(self) -> str:
        return f"{self.backend} at {self.minute:%Y-%m-%d %H:%M}: {self.requests} requests"


class HostSample(models.Model):
    """One node's host reading (RAM, load) at one moment: the only history a CPU node has.

    No foreign key, as for ``TelemetrySample``."""

    node_id = models.UUIDField(db_index=False)
    node_name = models.CharField(max_length=63)
    at = models.DateTimeField()
    reported_at = models.DateTimeField(help_text="The node's last heartbeat, which carried the reading.")
    memory_total_bytes = models.BigIntegerField(null=True)
    memory_available_bytes = models.BigIntegerField(null=True)
    load_1m = models.FloatField(null=True)
    cpu_count = models.PositiveIntegerField(null=True)

    class Meta:
        ordering = ["node_id", "at"]
        indexes = [
            models.Index(fields=["node_id", "at"], name="observ_host_node_at"),
            models.Index(fields=["at"], name="observ_host_at"),
        ]

    def __str__(self) -> str:
        return f"{self.node_name} host at {self.at:%Y-%m-%d %H:%M:%S}"


class UsageSample(models.Model):
    """What one credential used of one capability through one backend in one minute, rolled up from the
    gateway's shared counters (apps/gateway/usage.py). No foreign key: the credential lives in the
    authoritative database, which may be another server; its id and project are copied."""

    minute = models.DateTimeField()
    credential = models.CharField(max_length=64, help_text="The client credential's id.")
    project = models.CharField(max_length=63, blank=True)
    capability = models.CharField(max_length=80)
    backend = models.CharField(
        max_length=200, blank=True, help_text="The backend's name; empty when none was reached."
    )
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    unmetered = models.PositiveIntegerField(
        default=0, help_text="Answers whose engine reported no token usage (counted, never guessed)."
    )
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    ttft_ms = models.BigIntegerField(default=0, help_text="Sum of streamed answers' times to first token.")
    ttft_count = models.PositiveIntegerField(default=0, help_text="Streamed answers timed.")
    latency_ms = models.BigIntegerField(default=0, help_text="Sum of the answers' total times.")

    class Meta:
        ordering = ["-minute", "credential", "capability", "backend"]
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "credential", "capability", "backend"], name="observ_usage_one_per_minute"
            )
        ]
        indexes = [
            models.Index(fields=["minute"], name="observ_usage_minute"),
            models.Index(fields=["credential", "minute"], name="observ_usage_credential"),
        ]

    def __str__(self) -> str:
        return f"{self.credential} {self.capability} at {self.minute:%Y-%m-%d %H:%M}: {self.requests}"
