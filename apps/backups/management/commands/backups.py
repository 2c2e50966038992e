"""``manage.py backups``: the same backup and restore machinery from a shell, in the foreground.

For operators without a worker at hand (or a cron of their own), and for the tests that kill a real
backup or restore process at a chosen point.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.backups import restore, snapshot, verification
from apps.backups.models import Backup, Restore
from modelforge.errors import ApiError


class Command(BaseCommand):
    help = (
        "Take, verify, restore and sweep backups in the foreground "
        "(docs/operations/RUNBOOK_DATABASE_RESTORE.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        take = sub.add_parser("take", help="take a backup now, then verify it")
        take.add_argument("--by", default="manage.py")
        take.add_argument("--no-verify", action="store_true")
        verify = sub.add_parser("verify", help="(re-)verify a backup")
        verify.add_argument("backup", type=int)
        run = sub.add_parser("restore", help="restore a verified backup (switches the database in service)")
        run.add_argument("backup", type=int)
        run.add_argument("--by", required=True)
        run.add_argument("--reason", required=True)
        sub.add_parser("sweep", help="fail interrupted backups and restores; retention; staleness")
        rev = sub.add_parser("review", help="acknowledge or abandon a failed restore")
        rev.add_argument("restore", type=int)
        rev.add_argument("decision", choices=["acknowledge", "abandon"])
        rev.add_argument("--by", required=True)
        rev.add_argument("--reason", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            result = getattr(self, f"_{action}")(options)
        except ApiError as refusal:
            raise CommandError(f"{refusal.code}: {refusal.message}") from None
        self.stdout.write(json.dumps(result, default=str))

    def _take(self, options: dict[str, Any]) -> dict[str, Any]:
        backup = snapshot.request_backup(trigger="operator", by=options["by"])
        state = snapshot.take(backup.pk)
        if state == "completed" and not options["no_verify"]:
            state = verification.verify(backup.pk)
        backup.refresh_from_db()
        return {
            "backup": backup.pk,
            "state": state,
            "reason_code": backup.reason_code,
            "reason": backup.reason_message,
        }

    def _verify(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"backup": options["backup"], "state": verification.verify(options["backup"])}

    def _restore(self, options: dict[str, Any]) -> dict[str, Any]:
        backup = Backup.objects.get(pk=options["backup"])
        queued = restore.request_restore(backup, by=options["by"], reason=options["reason"])
        state = restore.run(queued.pk)
        done = Restore.objects.get(pk=queued.pk)
        return {
            "restore": done.pk,
            "state": state,
            "rpo_seconds": done.rpo_seconds,
            "failure": done.failure_message,
        }

    def _sweep(self, options: dict[str, Any]) -> dict[str, Any]:
        from apps.backups.tasks import housekeeping

        return housekeeping()  # the beat task's own body, run here in the foreground

    def _review(self, options: dict[str, Any]) -> dict[str, Any]:
        found = Restore.objects.filter(pk=options["restore"]).first()
        if found is None:
            raise CommandError(f"no restore #{options['restore']}")
        done = restore.review(found, decision=options["decision"], by=options["by"], note=options["reason"])
        return {"restore": done.pk, "review_decision": done.review_decision}
