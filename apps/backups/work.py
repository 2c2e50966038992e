"""Backups' and restores' waiting work (``apps.core.work``): a queued backup nobody takes, a completed one
nobody verifies, a queued restore nobody runs. Registered at ``BackupsConfig.ready()``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from apps.backups.models import Backup, BackupState, Restore, RestoreState
from apps.core.work import WORK_CANCELLED, Kind, Waiting, bound, moved_on
from modelforge.dispatch import send
from modelforge.errors import ApiError


def _backups() -> Iterable[Waiting]:
    for backup in Backup.objects.filter(state__in=(BackupState.QUEUED, BackupState.COMPLETED)):
        if backup.state == BackupState.QUEUED:
            yield Waiting(
                "backup",
                str(backup.pk),
                f"backup #{backup.pk}",
                backup.state,
                "a worker to take it",
                backup.requested_at,
                bound("WORK_RESEND_AFTER"),
                bound("WORK_STUCK_AFTER"),
                backup,
            )
        else:
            yield Waiting(
                "backup",
                str(backup.pk),
                f"backup #{backup.pk}",
                backup.state,
                "a worker to verify it",
                backup.finished_at or backup.requested_at,
                bound("WORK_RESEND_AFTER"),
                bound("WORK_STUCK_AFTER") + bound("WORK_LONG_TASK_BOUND"),
                backup,
            )


def _resend_backup(backup: Any) -> None:
    from apps.backups.tasks import take_backup, verify_backup

    send(take_backup if backup.state == BackupState.QUEUED else verify_backup, backup.pk)


def _fail_backup(backup: Any, by: str) -> None:
    message = f"marked failed by {by} while {backup.state}"
    try:
        backup.transition(
            BackupState.FAILED,
            detail=message,
            reason_code=WORK_CANCELLED,
            reason_message=message,
            finished_at=timezone.now(),
        )
    except ApiError:
        raise moved_on("backup", backup.pk) from None


def _restores() -> Iterable[Waiting]:
    for restore in Restore.objects.filter(state=RestoreState.QUEUED):
        yield Waiting(
            "restore",
            str(restore.pk),
            f"restore #{restore.pk}",
            restore.state,
            "a worker to run it",
            restore.requested_at,
            bound("WORK_RESEND_AFTER"),
            bound("WORK_STUCK_AFTER"),
            restore,
        )


def _resend_restore(restore: Any) -> None:
    from apps.backups.tasks import run_restore

    send(run_restore, restore.pk)


def _fail_restore(restore: Any, by: str) -> None:
    try:
        restore.transition(
            RestoreState.FAILED,
            detail=f"cancelled by {by} before it started",
            by=by,
            failure_code=WORK_CANCELLED,
            failure_message=f"cancelled by {by} before it started; the service database was not touched",
            finished_at=timezone.now(),
        )
    except ApiError:
        raise moved_on("restore", restore.pk) from None


KINDS = (
    Kind("backup", "Backups", 10, _backups, retry=_resend_backup, fail=_fail_backup),
    Kind("restore", "Restores", 20, _restores, retry=_resend_restore, fail=_fail_restore),
)
