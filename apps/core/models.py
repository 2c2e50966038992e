from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone


class InstallationManager(models.Manager["Installation"]):
    def current(self) -> Installation:
        """The one installation row, created on first use (idempotent under concurrency)."""
        installation, _ = self.get_or_create(singleton=True)
        return installation


class Installation(models.Model):
    """The installation this database belongs to: its identity and when its processes were last seen."""

    singleton = models.BooleanField(default=True, unique=True, editable=False)
    installation_id = models.UUIDField(default=uuid.uuid4, editable=False, unique=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by_release = models.CharField(max_length=32, editable=False)
    worker_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    worker_seen_hostname = models.CharField(max_length=255, blank=True, editable=False)
    # Stamped by beat's own scheduler as it ticks (modelforge.beat), not by a task it sends: a task's
    # stamp would also go stale with the worker or the broker, and BEAT_MISSING would name the wrong one.
    beat_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    beat_seen_hostname = models.CharField(max_length=255, blank=True, editable=False)
    # Stamped by each completed pass of the worker's alert notifications (apps.alerts.notify.worker_pass):
    # the web processes raise NOTIFY_STALLED from it, a path that does not need the pass to work.
    notify_passed_at = models.DateTimeField(null=True, blank=True, editable=False)
    notify_crashed_at = models.DateTimeField(null=True, blank=True, editable=False)
    notify_crash = models.TextField(blank=True, editable=False)

    objects = InstallationManager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(singleton=True), name="core_installation_singleton"),
        ]

    def __str__(self) -> str:
        return f"ModelForge installation {self.installation_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.created_by_release:
            from django.conf import settings

            self.created_by_release = settings.RELEASE
        super().save(*args, **kwargs)

    def record_worker_seen(self, hostname: str, at: datetime | None = None) -> None:
        """A worker ran a task just now: the dashboard's proof that the background machinery works."""
        self.worker_seen_at = at or timezone.now()
        self.worker_seen_hostname = hostname[:255]
        self.save(update_fields=["worker_seen_at", "worker_seen_hostname"])

    def record_beat_seen(self, hostname: str, at: datetime | None = None) -> None:
        """Beat's scheduler ticked just now: it is alive and sending the schedule."""
        self.beat_seen_at = at or timezone.now()
        self.beat_seen_hostname = hostname[:255]
        self.save(update_fields=["beat_seen_at", "beat_seen_hostname"])

    def record_notify_pass(self, at: datetime | None = None) -> None:
        """The worker completed a pass of alert notifications just now."""
        self.notify_passed_at = at or timezone.now()
        self.save(update_fields=["notify_passed_at"])

    def record_notify_crash(self, error: str, at: datetime | None = None) -> None:
        """A pass of alert notifications crashed with ``error``: named by NOTIFY_STALLED."""
        self.notify_crashed_at = at or timezone.now()
        self.notify_crash = error[:2000]
        self.save(update_fields=["notify_crashed_at", "notify_crash"])
