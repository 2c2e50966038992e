"""The platform invariants: properties the platform's own state always has, each a query that counts the
rows breaking it. They read authoritative tables only, never the monitoring store, so "is state still
sound?" has a precise answer when monitoring is what failed. Backup verification runs them on every
restored copy; ``GET /api/v1/system/invariants``, ``manage.py check_invariants`` and the dashboard's
overview run them on the live database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone


@dataclass(frozen=True)
class Invariant:
    """A property the platform's own state always has; ``query`` counts the rows that break it."""

    name: str
    description: str
    query: str


INVARIANTS = [
    Invariant(
        "one_installation",
        "at most one installation row (the singleton)",
        "SELECT greatest(count(*) - 1, 0) FROM core_installation",
    ),
    Invariant(
        "one_open_alert_per_key",
        "at most one open alert per de-duplication key",
        "SELECT count(*) FROM (SELECT dedup_key FROM alerts_alert WHERE cleared_at IS NULL "
        "GROUP BY dedup_key HAVING count(*) > 1) AS d",
    ),
    Invariant(
        "gpu_memory_bounds",
        "every GPU's managed <= used <= total memory",
        "SELECT count(*) FROM nodes_gpu WHERE NOT (0 <= memory_managed_bytes "
        "AND memory_managed_bytes <= memory_used_bytes AND memory_used_bytes <= memory_total_bytes)",
    ),
    Invariant(
        "reservations_on_their_node",
        "every GPU reservation is on a GPU of the node it names",
        "SELECT count(*) FROM servers_reservation r JOIN nodes_gpu g ON g.id = r.gpu_id "
        "WHERE g.node_id <> r.node_id",
    ),
    Invariant(
        "credentials_hashed",
        "every client credential and node credential is stored as a 64-hex digest",
        "SELECT (SELECT count(*) FROM clusters_clientcredential WHERE secret_hash !~ '^[0-9a-f]{64}$') "
        "+ (SELECT count(*) FROM nodes_node WHERE credential_hash !~ '^[0-9a-f]{64}$')",
    ),
    Invariant(
        "verified_backups_have_files",
        "every verified backup records its files and snapshot time",
        "SELECT count(*) FROM backups_backup WHERE state = 'verified' "
        "AND (jsonb_array_length(files) = 0 OR consistent_as_of IS NULL)",
    ),
]


def check_live() -> dict[str, Any]:
    """Every invariant against the service database: ``sound`` and each one's broken-row count."""
    results = []
    with connection.cursor() as cursor:
        for invariant in INVARIANTS:
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
