from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils import timezone

from apps.backups.choices import BackupState, RestorePhaseName, RestoreState, ReviewDecision
from apps.backups.codes import INVALID_BACKUP_STATE, INVALID_RESTORE_STATE
from apps.core.transitions import StatefulModel

BACKUP_ACTIVE = (BackupState.QUEUED, BackupState.RUNNING)

# Allowed moves, as taking, verifying, retention and the stuck-work watchdog make them: a worker claims a
# queued backup (running) and finishes it (completed, or failed; an interrupted one is swept to failed);
# verification makes a completed or verified backup verified (again) or failed; retention expires a
# completed or verified one; an operator marks a queued or completed one failed while it waits.
BACKUP_TRANSITIONS: dict[str, tuple[str, ...]] = {
    BackupState.QUEUED: (BackupState.RUNNING, BackupState.FAILED),
    BackupState.RUNNING: (BackupState.COMPLETED, BackupState.FAILED),
    BackupState.COMPLETED: (BackupState.VERIFIED, BackupState.FAILED, BackupState.EXPIRED),
    BackupState.VERIFIED: (BackupState.VERIFIED, BackupState.FAILED, BackupState.EXPIRED),
    BackupState.FAILED: (),
    BackupState.EXPIRED: (),
}


class BackupQuerySet(models.QuerySet["Backup"]):
    def eligible(self) -> BackupQuerySet:
        """Restore-eligible: verified, and its files still there."""
        return self.filter(state=BackupState.VERIFIED)

    def newest_verified(self) -> Backup | None:
        return self.eligible().order_by("-consistent_as_of", "-id").first()


class Backup(StatefulModel):
    """A snapshot of the control-plane database in its own directory, described by a manifest."""

    TRANSITIONS = BACKUP_TRANSITIONS
    INVALID_STATE_CODE = INVALID_BACKUP_STATE

    state = models.CharField(max_length=16, choices=BackupState.choices, default=BackupState.QUEUED)
    reason_code = models.CharField(max_length=64, blank=True)
    reason_message = models.TextField(blank=True)
    trigger = models.CharField(max_length=16, default="operator", help_text="operator or schedule")
    requested_by = models.CharField(max_length=150, blank=True)
    phase = models.CharField(max_length=32, blank=True, help_text="The step running now, for progress.")
    directory = models.CharField(max_length=1000, blank=True)
    files = models.JSONField(default=list, blank=True, help_text="[{name, size, sha256}] from the manifest.")
    size_bytes = models.BigIntegerField(default=0)
    database_name = models.CharField(max_length=128, blank=True)
    server_version = models.CharField(max_length=64, blank=True)
    schema_revision = models.CharField(max_length=64, blank=True, help_text="sha256 of applied migrations.")
    modelforge_version = models.CharField(max_length=32, blank=True)
    row_counts = models.JSONField(default=dict, blank=True, help_text="Key tables' rows in the snapshot.")
    requested_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    consistent_as_of = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    verification = models.JSONField(default=dict, blank=True, help_text="The last verification's steps.")
    expired_at = models.DateTimeField(null=True, blank=True)

    objects = BackupQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at", "-id"]

    def __str__(self) -> str:
        return f"backup #{self.pk} ({self.state})"

    @property
    def restore_eligible(self) -> bool:
        return self.state == BackupState.VERIFIED

    def state_subject(self) -> str:
        return f"Backup #{self.pk}"

    def record_transition(self, before: str, to: str, *, at: datetime, detail: str, by: str) -> None:
        BackupEvent.objects.create(backup=self, from_state=before, to_state=to, at=at, detail=detail[:2000])


class BackupEvent(models.Model):
    """A state change of a backup, with what happened."""

    backup = models.ForeignKey(Backup, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    at = models.DateTimeField(default=timezone.now)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.backup_id} {self.from_state}->{self.to_state}"


# Allowed moves, as a restore's run and the stuck-work watchdog make them: a worker claims a queued restore
# (running) and finishes it (completed, or failed awaiting review; an interrupted one is swept to failed);
# an operator cancels a queued one (failed) before it starts.
RESTORE_TRANSITIONS: dict[str, tuple[str, ...]] = {
    RestoreState.QUEUED: (RestoreState.RUNNING, RestoreState.FAILED),
    RestoreState.RUNNING: (RestoreState.COMPLETED, RestoreState.FAILED),
    RestoreState.COMPLETED: (),
    RestoreState.FAILED: (),
}


class Restore(StatefulModel):
    """An operator's restore of a verified backup, run in recorded phases; the switch-over is last."""

    TRANSITIONS = RESTORE_TRANSITIONS
    INVALID_STATE_CODE = INVALID_RESTORE_STATE

    backup = models.ForeignKey(Backup, on_delete=models.PROTECT, related_name="restores")
    state = models.CharField(max_length=16, choices=RestoreState.choices, default=RestoreState.QUEUED)
    phase = models.CharField(max_length=16, choices=RestorePhaseName.choices, blank=True)
    requested_by = models.CharField(max_length=150)
    reason = models.TextField()
    requested_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    target_database = models.CharField(
        max_length=128, blank=True, help_text="The new database restored into."
    )
    previous_database = models.CharField(
        max_length=128, blank=True, help_text="Where the replaced database was kept after switch-over."
    )
    switched_over = models.BooleanField(default=False)
    consistent_as_of = models.DateTimeField(null=True, blank=True)
    rpo_seconds = models.FloatField(
        null=True, blank=True, help_text="Changes lost: switch-over time minus the backup's consistent-as-of."
    )
    failure_code = models.CharField(max_length=64, blank=True)
    failure_message = models.TextField(blank=True)
    needs_review = models.BooleanField(default=False)
    review_decision = models.CharField(max_length=16, choices=ReviewDecision.choices, blank=True)
    reviewed_by = models.CharField(max_length=150, blank=True)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_note = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            # At most one restore at a time (queued, running, or stopped and awaiting review).
            models.UniqueConstraint(
                fields=["needs_review"],
                condition=models.Q(needs_review=True),
                name="backups_one_restore_awaiting_review",
            ),
        ]

    def __str__(self) -> str:
        return f"restore #{self.pk} of backup #{self.backup_id} ({self.state})"

    def state_subject(self) -> str:
        return f"Restore #{self.pk}"

    def record_transition(self, before: str, to: str, *, at: datetime, detail: str, by: str) -> None:
        """No event table: a restore's history is its ``RestorePhase`` rows (each phase as it starts and
        ends, with its outcome) and its own failure and review fields. Its last move happens in the
        database it has just switched over to, where only the catalogue tables were carried
        (apps.backups.restore.CATALOGUE_TABLES); a fifth table there is a risk with no reader."""


class RestorePhase(models.Model):
    """One phase of a restore: recorded as it starts and as it ends."""

    restore = models.ForeignKey(Restore, on_delete=models.CASCADE, related_name="phases")
    name = models.CharField(max_length=16, choices=RestorePhaseName.choices)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, help_text="ok, failed or interrupted")
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["started_at", "id"]

    def __str__(self) -> str:
        return f"{self.restore_id} {self.name} {self.outcome or 'running'}"
