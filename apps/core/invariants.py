"""The platform invariants: properties the platform's own state always has, each a query that counts the
rows breaking it. They read authoritative tables only, never the monitoring store, so "is state still
sound?" has a precise answer when monitoring is what failed. Backup verification runs them on every
restored copy; ``GET /api/v1/system/invariants``, ``manage.py check_invariants`` and the dashboard's
overview run them on the live database.

Each app registers the invariants over its own tables (``apps.core.registry.invariants``) at start-up;
``registry.invariants`` is every one, in ``INSTALLED_APPS`` order."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone

from apps.core import registry


def check_live() -> dict[str, Any]:
    """Every invariant against the service database: ``sound`` and each one's broken-row count."""
    results = []
    with connection.cursor() as cursor:
        for invariant in registry.invariants:
            cursor.execute(invariant.query)
            row = cursor.fetchone()
            results.append(
                {"name": invariant.name, "description": invariant.description, "violations": int(row[0] or 0)}
            )
    from apps.core import work

    # Live only (a restored copy's in-flight rows are as old as the backup): work past its bound.
    results.append(
        {
            "name": "no_work_past_its_bound",
            "description": "no backup, restore, server, artifact or replica waits past its bound",
            "violations": work.past_bound_count(),
        }
    )
    return {
        "sound": not any(r["violations"] for r in results),
        "checked_at": timezone.now(),
        "invariants": results,
    }
