"""The operator's rules about backups, each written once for the API, the dashboard and the admin.

Taking a backup (``snapshot.request_backup``), restoring one (``restore.request_restore``) and reviewing a
restore (``restore.review``) are single functions already; verification is the rule here.
"""

from __future__ import annotations

from apps.backups.models import Backup, BackupState
from modelforge.dispatch import send_on_commit

VERIFIABLE = (BackupState.COMPLETED, BackupState.VERIFIED)


def request_verification(backup: Backup) -> bool:
    """Send ``backup``'s verification (again) if it is completed or verified; ``False`` when there is
    nothing to verify and nothing was sent (the API answers 200 then, the dashboard says so)."""
    from apps.backups.tasks import verify_backup

    if backup.state not in VERIFIABLE:
        return False
    send_on_commit(verify_backup, backup.pk)
    return True
