"""Thin Celery wrappers over backups and restores (the work lives in snapshot, verification, restore)."""

from __future__ import annotations

from celery import shared_task

from apps.backups import restore, snapshot, verification
from apps.backups.models import BackupState
from modelforge.dispatch import send
from modelforge.errors import ApiError


@shared_task(name="backups.scheduled_backup")
def scheduled_backup() -> str:
    """The beat entry (editable in the admin): queue a backup unless one or a restore is running."""
    try:
        backup = snapshot.request_backup(trigger="schedule", by="schedule")
    except ApiError as refusal:
        return refusal.code
    return take_backup(backup.pk)


@shared_task(name="backups.take_backup")
def take_backup(backup_id: int) -> str:
    state = snapshot.take(backup_id)
    if state == BackupState.COMPLETED:
        # Verification is automatic, and is its own task so a worker restart between them loses nothing.
        send(verify_backup, backup_id)
    return state


@shared_task(name="backups.verify_backup")
def verify_backup(backup_id: int) -> str:
    return verification.verify(backup_id)


@shared_task(name="backups.run_restore")
def run_restore(restore_id: int) -> str:
    return restore.run(restore_id)


@shared_task(name="backups.housekeeping")
def housekeeping() -> dict[str, object]:
    """Fail interrupted backups and restores, apply retention, raise or clear ``BACKUP_STALE``."""
    return {
        "interrupted_backups": snapshot.sweep_interrupted(),
        "interrupted_restores": restore.sweep_interrupted(),
        "expired": snapshot.prune(),
        "stale": snapshot.check_staleness(),
    }
