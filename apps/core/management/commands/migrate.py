"""Django's ``migrate``, refusing a PostgreSQL older than 16 first (INCOMPATIBLE_DATABASE, exit 3).

Every other entry point refuses such a server; a schema created there could never be served.
Schema-revision verdicts (UNKNOWN, TOO_OLD) are not checked: migrating is how they are fixed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands.migrate import Command as DjangoMigrateCommand

from modelforge.startup import enforce_database_server


class Command(DjangoMigrateCommand):
    def handle(self, *args: Any, **options: Any) -> None:
        enforce_database_server(options["database"])
        super().handle(*args, **options)
