"""Say whether the configured database is one this release can serve on (exit 3 when it is not)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from modelforge.compatibility import DatabaseUnreachable, check_database
from modelforge.startup import EXIT_REFUSED


class Command(BaseCommand):
    help = "Check PostgreSQL's version and the schema revision against this release."

    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            incompatibility = check_database()
        except DatabaseUnreachable as exc:
            raise CommandError(f"the database is unreachable: {exc}") from exc
        if incompatibility is not None:
            self.stderr.write(incompatibility.refusal())
            raise SystemExit(EXIT_REFUSED)
        self.stdout.write("The database is compatible with this release.")
