"""``manage.py check_invariants``: the platform invariants on the live database; exit 1 if one breaks."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.core.invariants import check_live


class Command(BaseCommand):
    help = "Check the platform invariants on the service database (authoritative tables only)."

    def handle(self, *args: Any, **options: Any) -> None:
        result = check_live()
        for item in result["invariants"]:
            mark = "ok" if not item["violations"] else f"BROKEN by {item['violations']} row(s)"
            self.stdout.write(f"{item['name']:<30} {mark:<22} {item['description']}")
        if not result["sound"]:
            raise CommandError("the platform state is not sound: see the invariants marked BROKEN")
        self.stdout.write(self.style.SUCCESS("sound: every invariant holds"))
