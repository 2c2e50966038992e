"""The liveness sweep: online → stale → offline, set-based, one statement per transition."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.nodes import codes
from apps.nodes.choices import EventKind, Liveness
from apps.nodes.models import Node, NodeEvent
from apps.nodes.signals import nodes_went_offline

# One statement moves every node due for a transition and writes its event row. The row locks are
# taken with SKIP LOCKED: a node whose heartbeat is being recorded right now is not due, and the next
# sweep sees its fresh timestamp. The WHERE clause is re-checked under the lock, so a heartbeat that
# committed first is never overwritten.
_TRANSITION = f"""
WITH due AS (
    SELECT id, liveness FROM {Node._meta.db_table}
    WHERE liveness = ANY(%(from_states)s) AND last_heartbeat_at < %(before)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE {Node._meta.db_table} AS n SET liveness = %(to_state)s
    FROM due WHERE n.id = due.id
    RETURNING n.id, n.name, due.liveness AS from_state
), events AS (
    INSERT INTO {NodeEvent._meta.db_table} (node_id, kind, from_liveness, to_liveness, at, detail)
    SELECT id, %(kind)s, from_state, %(to_state)s, %(now)s, %(detail)s FROM moved
)
SELECT id, name FROM moved
"""  # noqa: S608 -- table names are ours


@dataclass
class SweepResult:
    """Which nodes the sweep moved."""

    stale: list[tuple[str, str]] = field(default_factory=list)
    offline: list[tuple[str, str]] = field(default_factory=list)


def _transition(
    cursor: Any, from_states: list[str], to_state: str, before: datetime, now: datetime, detail: str
) -> list[tuple[str, str]]:
    cursor.execute(
        _TRANSITION,
        {
            "from_states": from_states,
            "to_state": to_state,
            "before": before,
            "now": now,
            "kind": EventKind.LIVENESS,
            "detail": detail,
        },
    )
    return [(str(node_id), name) for node_id, name in cursor.fetchall()]


def sweep(now: datetime | None = None) -> SweepResult:
    """Apply due transitions as of ``now`` and raise their alerts.

    1. offline: online or stale nodes silent for longer than ``NODE_OFFLINE_AFTER``.
    2. stale: online nodes silent for longer than ``NODE_STALE_AFTER``.
    3. alerts: ``node_offline`` (critical) and ``NODE_STALE`` (warning), one statement each,
       de-duplicated by the alerts core.
    """
    now = now or timezone.now()
    offline_before = now - timedelta(seconds=settings.NODE_OFFLINE_AFTER)
    stale_before = now - timedelta(seconds=settings.NODE_STALE_AFTER)
    result = SweepResult()
    with transaction.atomic(), connection.cursor() as cursor:
        result.offline = _transition(
            cursor,
            [Liveness.ONLINE, Liveness.STALE],
            Liveness.OFFLINE,
            offline_before,
            now,
            f"no heartbeat for more than {settings.NODE_OFFLINE_AFTER} s",
        )
        result.stale = _transition(
            cursor,
            [Liveness.ONLINE],
            Liveness.STALE,
            stale_before,
            now,
            f"no heartbeat for more than {settings.NODE_STALE_AFTER} s",
        )
        Alert.objects.raise_many(
            codes.ALERT_NODE_OFFLINE,
            Severity.CRITICAL,
            "node",
            result.offline,
            f"Node {{name}} is offline: no heartbeat for more than {settings.NODE_OFFLINE_AFTER} s. "
            "Is the agent running and able to reach the control plane?",
            at=now,
        )
        Alert.objects.raise_many(
            codes.ALERT_NODE_STALE,
            Severity.WARNING,
            "node",
            result.stale,
            f"Node {{name}} is stale: no heartbeat for more than {settings.NODE_STALE_AFTER} s. "
            "Nothing new is assigned to it until it reports again.",
            at=now,
        )
        if result.offline:
            # Higher layers (model servers on those nodes) react in the same transaction.
            nodes_went_offline.send(sender=sweep, nodes=result.offline, at=now)
    return result
