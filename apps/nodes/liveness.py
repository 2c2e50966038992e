"""The liveness sweep: online → stale → offline, set-based, one statement per transition."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert, AroundName, dedup_key_for
from apps.nodes import codes, listening, signals
from apps.nodes.choices import EventKind, Liveness
from apps.nodes.models import ListeningClock, Node, NodeEvent, liveness_now_sql
from apps.nodes.signals import nodes_went_offline

# A node's liveness as it is now (models.liveness_now): its column, except that an online or stale node
# silent since before the clock's ``fleet_offline_before`` is offline, and an online node silent since
# before its ``fleet_stale_before`` is stale. A transition that takes many nodes at once is written as
# that one fleet state (``_FLEET``) instead of a row version per node. Parameters: ``_held(clock)``.
_LIVENESS_NOW = liveness_now_sql(
    "COALESCE(%(fleet_offline)s::timestamptz, '-infinity')",
    "COALESCE(%(fleet_stale)s::timestamptz, '-infinity')",
)


def _held(clock: ListeningClock) -> dict[str, datetime | None]:
    return {"fleet_offline": clock.fleet_offline_before, "fleet_stale": clock.fleet_stale_before}


def _sql(template: str, clock: ListeningClock) -> str:
    """A statement with ``{now}`` read as the state as it is now -- the bare column while no fleet state is
    set (the sweep clears them once no node is held by one), so that a sweep with nothing due works out
    no state per row (bench/heartbeats, 2026-12-06)."""
    return template.replace("{now}", _LIVENESS_NOW if _holds(clock) else "liveness")


def _holds(clock: ListeningClock) -> bool:
    return clock.fleet_offline_before is not None or clock.fleet_stale_before is not None


# One statement moves every node due for a transition and writes its event, a row per node. It runs only
# when the census counted few nodes due (many take ``_FLEET``), and a transition can only move fewer than
# the census counted under the same limit -- a heartbeat only makes a node's timestamp newer -- so it never
# writes a fleet's worth of rows. The row locks are taken with SKIP LOCKED: a node whose heartbeat is being
# recorded right now is not due, and the next sweep sees its fresh timestamp. The WHERE clause is
# re-checked under the lock, so a heartbeat that committed first is never overwritten.
_TRANSITION = f"""
WITH due AS (
    SELECT id, {{now}} AS liveness FROM {Node._meta.db_table}
    WHERE liveness IN ('online', 'stale') AND last_heartbeat_at < %(before)s
      AND {{now}} = ANY(%(from_states)s)
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE {Node._meta.db_table} AS n SET liveness = %(to_state)s
    FROM due WHERE n.id = due.id
    RETURNING n.id, n.name, due.liveness AS from_state
), node_events AS (
    INSERT INTO {NodeEvent._meta.db_table} (node_id, kind, from_liveness, to_liveness, at, detail)
    SELECT id, %(kind)s, from_state, %(to_state)s, %(now)s, %(detail)s FROM moved
)
SELECT id::text, name, (SELECT count(*) FROM moved WHERE from_state = %(online)s), NULL::bigint FROM moved
"""  # noqa: S608 -- table names are ours

# A transition that takes many nodes at once (more than ``many_above``, the mass-loss guard's "many") writes
# no node row: the clock's ``fleet_stale_before`` or ``fleet_offline_before`` moves up to the transition's
# limit (``_fleet``; the sweep saves the clock), which makes every node silent since before it stale or
# offline (``_LIVENESS_NOW``), and one event row names them. A whole fleet's worth of row versions and
# their locks was such a sweep's whole cost (bench/heartbeats). A node that reports again is online at
# once: its heartbeat is newer than the limit, and the heartbeat writes its row.
_FLEET = f"""
WITH due AS MATERIALIZED (
    SELECT id, name, {{now}} AS from_state FROM {Node._meta.db_table}
    WHERE liveness IN ('online', 'stale') AND last_heartbeat_at < %(before)s
      AND {{now}} = ANY(%(from_states)s)
), fleet_event AS (
    INSERT INTO {NodeEvent._meta.db_table} (node_id, nodes, kind, from_liveness, to_liveness, at, detail)
    SELECT NULL, array_agg(id), %(kind)s, string_agg(DISTINCT from_state, ',' ORDER BY from_state),
           %(to_state)s, %(now)s, %(detail)s || ' (' || count(*) || ' nodes at once)'
    FROM due HAVING count(*) > 0
    RETURNING id
)
SELECT id::text, name, (SELECT count(*) FROM due WHERE from_state = %(online)s), (SELECT id FROM fleet_event)
FROM due
"""  # noqa: S608 -- table names are ours


@dataclass
class _Moved:
    """What one transition moved: the nodes, how many of them were online, and its fleet event row (when
    it moved many at once)."""

    nodes: list[tuple[str, str]]
    from_online: int = 0
    fleet_event: int | None = None


@dataclass
class SweepResult:
    """Which nodes the sweep moved."""

    stale: list[tuple[str, str]] = field(default_factory=list)
    offline: list[tuple[str, str]] = field(default_factory=list)


def _transition(
    cursor: Any,
    clock: ListeningClock,
    from_states: list[str],
    to_state: str,
    before: datetime,
    now: datetime,
    detail: str,
    alive: int,
    due: int,
) -> _Moved:
    """Move the nodes in ``from_states`` silent since before ``before`` to ``to_state``: row by row, or --
    when ``due`` (the census's count, which can only shrink as heartbeats arrive) is many at once -- as
    the fleet's state on the clock."""
    many = due > _many_above(alive)
    cursor.execute(
        _sql(_FLEET if many else _TRANSITION, clock),
        {
            **_held(clock),
            "online": Liveness.ONLINE,
            "from_states": from_states,
            "to_state": to_state,
            "before": before,
            "now": now,
            "kind": EventKind.LIVENESS,
            "detail": detail,
        },
    )
    # The ids come back as text: a whole fleet's worth of UUID objects, made here and turned back into
    # strings for the alerts, cost more than the statement's own work (bench/heartbeats).
    rows = cursor.fetchall()
    if many:
        field_name = "fleet_offline_before" if to_state == Liveness.OFFLINE else "fleet_stale_before"
        held = getattr(clock, field_name)
        setattr(clock, field_name, before if held is None else max(held, before))
    if not rows:
        return _Moved([])
    return _Moved([(node_id, name) for node_id, name, _, _ in rows], rows[0][2], rows[0][3])


# One pass over the nodes that can move, before any transition: what the mass-loss guard weighs, and
# whether either transition has anything to do (a sweep with nothing due -- nearly every sweep -- then
# reads the table once instead of three times). States as they are now (``_LIVENESS_NOW``).
_CENSUS = f"""
SELECT count(*) FILTER (WHERE alive AND last_heartbeat_at < %(stale_before)s
                          AND (%(confirmed)s::timestamptz IS NULL OR last_heartbeat_at >= %(confirmed)s)),
       count(*) FILTER (WHERE alive),
       min(last_heartbeat_at) FILTER (WHERE alive AND last_heartbeat_at < %(before)s),
       count(*) FILTER (WHERE alive AND last_heartbeat_at < %(before)s),
       count(*) FILTER (WHERE alive AND last_heartbeat_at < LEAST(%(before)s, %(confirmed)s::timestamptz)),
       count(*) FILTER (WHERE state = %(online)s AND last_heartbeat_at < %(stale_before)s),
       count(*) FILTER (WHERE state <> liveness)
FROM (
    SELECT state, state IN ('online', 'stale') AS alive, liveness, last_heartbeat_at
    FROM (SELECT {{now}} AS state, liveness, last_heartbeat_at FROM {Node._meta.db_table}
          WHERE liveness IN ('online', 'stale')) AS n
) AS n
"""  # noqa: S608 -- the table name is ours
# The same with no fleet state set (nearly always): every node it reads is alive and none is held, and no
# state is worked out per row (bench/heartbeats, 2026-12-06).
_CENSUS_PLAIN = f"""
SELECT count(*) FILTER (WHERE last_heartbeat_at < %(stale_before)s
                          AND (%(confirmed)s::timestamptz IS NULL OR last_heartbeat_at >= %(confirmed)s)),
       count(*),
       min(last_heartbeat_at) FILTER (WHERE last_heartbeat_at < %(before)s),
       count(*) FILTER (WHERE last_heartbeat_at < %(before)s),
       count(*) FILTER (WHERE last_heartbeat_at < LEAST(%(before)s, %(confirmed)s::timestamptz)),
       count(*) FILTER (WHERE liveness = %(online)s AND last_heartbeat_at < %(stale_before)s),
       0
FROM {Node._meta.db_table} WHERE liveness IN ('online', 'stale')
"""  # noqa: S608 -- the table name is ours


@dataclass
class _Census:
    # Silent past the STALE limit and not yet confirmed lost: what the mass-loss guard weighs. Agents beat
    # on phases of their own, so nodes that went silent together cross the offline limit sweeps apart;
    # by then every one of them is past the stale limit (which comes a heartbeat interval or more earlier).
    due: int
    alive: int  # online or stale, as they are now
    silent_since: datetime | None
    offline_due: int  # silent past the offline limit, confirmed or not
    confirmed_due: int  # ... and silent since before an operator's confirmation of a mass loss
    stale_due: int  # online now and silent past the stale limit
    held: int  # in a fleet state: their column says otherwise


def _census(cursor: Any, clock: ListeningClock, offline_before: datetime, stale_before: datetime) -> _Census:
    cursor.execute(
        _sql(_CENSUS, clock) if _holds(clock) else _CENSUS_PLAIN,
        {
            **_held(clock),
            "before": offline_before,
            "stale_before": stale_before,
            "confirmed": clock.confirmed_at,
            "online": Liveness.ONLINE,
        },
    )
    return _Census(*cursor.fetchone())


def _gap(stamp: datetime | None, now: datetime) -> bool:
    return stamp is not None and (now - stamp).total_seconds() > settings.LISTENING_GAP


def sweep(now: datetime | None = None) -> SweepResult:
    """Apply due transitions as of ``now`` and raise their alerts.

    0. Listening: if the sweeps stopped for longer than ``MODELFORGE_LISTENING_GAP`` (worker, beat,
       broker or database away), every node's grace period restarts now; if no web process has stamped
       for that long, nothing can be heard and nothing moves. Silence is ``now - max(last heartbeat,
       listening since)`` (apps.nodes.listening).
    1. offline: online or stale nodes silent for longer than ``NODE_OFFLINE_AFTER`` -- unless more than
       ``LIVENESS_MASS_LOSS_FRACTION`` of them, in a fleet of at least ``LIVENESS_MASS_LOSS_MIN_NODES``,
       are silent past the stale limit (nodes silent together cross the offline limit a heartbeat phase
       apart; judged one sweep at a time they would go one by one): the control plane suspects itself,
       holds them stale, fails no server and raises one critical ``NODE_MASS_LOSS`` until an operator
       confirms or they come back.
    2. stale: online nodes silent for longer than ``NODE_STALE_AFTER``.

    A transition of many nodes at once (the mass-loss guard's "many": a held mass loss going stale, a
    confirmed one going offline) writes no node row: the clock's ``fleet_stale_before`` or
    ``fleet_offline_before`` moves up to its limit, and every node silent since before it is in that state
    (``Node.liveness_now``) until it reports (``_FLEET``).
    3. alerts: ``node_offline`` (critical) and ``NODE_STALE`` (warning), one statement each,
       de-duplicated by the alerts core -- one per node, or ONE for the fleet when the transition moved
       many nodes at once (``_raise``); a fleet alert clears itself once none of the nodes it covers is
       still in that state.
    """
    now = now or timezone.now()
    result = SweepResult()
    with transaction.atomic():
        clock = listening.locked()
        if clock.swept_at is not None and _gap(clock.swept_at, now):
            clock.listening_since = now
            clock.listening_reason = (
                f"no liveness sweep for {(now - clock.swept_at).total_seconds():.0f} s (worker, beat, broker "
                "or database away)"
            )
            transaction.on_commit(lambda: signals.listening_restarted.send(sender=sweep, at=now))
        deaf = _gap(clock.web_seen_at, now)
        if deaf:
            clock.listening_since = now
            clock.listening_reason = "no web process listening"
        clock.swept_at = now
        since = clock.listening_since
        offline_before = now - timedelta(seconds=settings.NODE_OFFLINE_AFTER)
        stale_before = now - timedelta(seconds=settings.NODE_STALE_AFTER)
        with connection.cursor() as cursor:
            # One census serves both transitions: listening since before the offline limit implies since
            # before the (shorter) stale limit.
            heard = not deaf and (since is None or since < stale_before)
            census = _census(cursor, clock, offline_before, stale_before) if heard else None
            if census is not None and not census.held:
                # No node is held by a fleet state: the timestamps have nothing left to say (a heartbeat
                # only ever moves a node's forward).
                clock.fleet_offline_before = clock.fleet_stale_before = None
            stale_due = census.stale_due if census is not None else 0
            offline = _Moved([])
            if census is not None and (since is None or since < offline_before):
                allowed = _guard_mass_loss(census, clock, offline_before, now)
                due = census.offline_due if allowed == offline_before else census.confirmed_due
                if allowed is not None and due:
                    offline = _transition(
                        cursor,
                        clock,
                        [Liveness.ONLINE, Liveness.STALE],
                        Liveness.OFFLINE,
                        allowed,
                        now,
                        f"no heartbeat for more than {settings.NODE_OFFLINE_AFTER} s",
                        census.alive,
                        due,
                    )
                    result.offline = offline.nodes
                    # The online nodes it took were due for the stale transition too: with none left, that
                    # transition is not run (over a whole fleet gone at once it scanned the table for none).
                    stale_due -= offline.from_online
            if census is not None and stale_due > 0:
                result.stale = _transition(
                    cursor,
                    clock,
                    [Liveness.ONLINE],
                    Liveness.STALE,
                    stale_before,
                    now,
                    f"no heartbeat for more than {settings.NODE_STALE_AFTER} s",
                    census.alive,
                    stale_due,
                ).nodes
        clock.save()
        alive = census.alive if census is not None else 0
        _raise(
            codes.ALERT_NODE_OFFLINE,
            Severity.CRITICAL,
            result.offline,
            alive,
            AroundName(
                "Node ",
                f" is offline: no heartbeat for more than {settings.NODE_OFFLINE_AFTER} s. "
                "Is the agent running and able to reach the control plane?",
            ),
            f"went offline at once: no heartbeat for more than {settings.NODE_OFFLINE_AFTER} s. Their "
            "servers were failed with NODE_OFFLINE. Is the network between them and the control plane up?",
            now,
        )
        _raise(
            codes.ALERT_NODE_STALE,
            Severity.WARNING,
            result.stale,
            alive,
            AroundName(
                "Node ",
                f" is stale: no heartbeat for more than {settings.NODE_STALE_AFTER} s. "
                "Nothing new is assigned to it until it reports again.",
            ),
            f"went stale at once: no heartbeat for more than {settings.NODE_STALE_AFTER} s. Nothing new is "
            "assigned to them until they report again.",
            now,
        )
        _clear_fleet_alerts(now, clock)
        if result.offline:
            # Higher layers (model servers on those nodes) react in the same transaction.
            # The fleet's event row names them all (``uuid[]``): a receiver reads the ids there rather than
            # from 10,000 ids sent back as text, which PostgreSQL then parses one by one (bench/heartbeats).
            nodes_went_offline.send(sender=sweep, nodes=result.offline, at=now, event=offline.fleet_event)
    return result


# The fleet's alert for a transition that moved many nodes at once has the transition's own code, on the
# subject of the mass-loss hold: ``NODE_STALE:fleet:liveness`` and ``node_offline:fleet:liveness``.
FLEET_ALERTS = {codes.ALERT_NODE_STALE: Liveness.STALE, codes.ALERT_NODE_OFFLINE: Liveness.OFFLINE}
NAMED_IN_FLEET_ALERT = 10


def _many(moved: int, alive: int) -> bool:
    """What the mass-loss guard calls many nodes at once: more than ``LIVENESS_MASS_LOSS_FRACTION`` of the
    ``alive`` (online or stale) nodes, in a fleet of at least ``LIVENESS_MASS_LOSS_MIN_NODES``."""
    return (
        alive >= settings.LIVENESS_MASS_LOSS_MIN_NODES
        and moved > settings.LIVENESS_MASS_LOSS_FRACTION * alive
    )


def _many_above(alive: int) -> int:
    """``_many`` as a count for SQL: a transition moving more nodes than this moved many at once."""
    if alive < settings.LIVENESS_MASS_LOSS_MIN_NODES:
        return 2**62  # nothing is many at once in a small fleet
    return int(settings.LIVENESS_MASS_LOSS_FRACTION * alive)


def _raise(
    code: str,
    severity: str,
    moved: list[tuple[str, str]],
    alive: int,
    per_node: AroundName,
    fleet: str,
    now: datetime,
) -> None:
    """One alert per moved node, or -- when the transition moved many nodes at once -- one alert for the
    fleet with the same code, naming how many and the first few (each node keeps its state and its event
    row; the Nodes page lists them all). A whole fleet's worth of per-node alerts was most of an all-due
    sweep's time (bench/heartbeats) and, through the notification channels, an alert storm."""
    if not moved:
        return
    if not _many(len(moved), alive):
        Alert.objects.raise_many(code, severity, "node", moved, per_node, at=now)
        return
    names = heapq.nsmallest(NAMED_IN_FLEET_ALERT, (name for _, name in moved))
    more = len(moved) - len(names)
    state = FLEET_ALERTS[code]
    Alert.objects.raise_alert(
        code,
        severity,
        *listening.MASS_LOSS_SUBJECT,
        "fleet liveness",
        f"{len(moved)} of {alive} nodes {fleet} One alert for them all: the Nodes page lists each "
        f"(liveness: {state}) with its event; among them {', '.join(names)}"
        f"{f' and {more} more' if more else ''}. It clears itself once none of them is {state}.",
        at=now,
    )


# A fleet alert covers the nodes in its state that have no alert of their own for it.
_UNCOVERED = f"""
SELECT a.code FROM {Alert._meta.db_table} a
WHERE a.dedup_key = ANY(%(keys)s) AND a.cleared_at IS NULL
  AND NOT EXISTS (
    SELECT 1 FROM {Node._meta.db_table} n
    WHERE {{now}} = CASE a.code WHEN %(stale_code)s THEN %(stale)s ELSE %(offline)s END
      AND NOT EXISTS (SELECT 1 FROM {Alert._meta.db_table} o
                      WHERE o.dedup_key = a.code || %(node_infix)s || n.id::text AND o.cleared_at IS NULL))
"""  # noqa: S608 -- the table names are ours


def _clear_fleet_alerts(now: datetime, clock: ListeningClock) -> None:
    """Clear each open fleet liveness alert none of whose nodes is still in its state (they reported: the
    heartbeat clears only a node's own alerts). One indexed look-up when none is open."""
    keys = [dedup_key_for(code, *listening.MASS_LOSS_SUBJECT) for code in FLEET_ALERTS]
    with connection.cursor() as cursor:
        cursor.execute(
            _sql(_UNCOVERED, clock),
            {
                "keys": keys,
                "node_infix": dedup_key_for("", "node", ""),  # a node's own key is code + this + id
                "stale_code": codes.ALERT_NODE_STALE,
                **_held(clock),
                "stale": Liveness.STALE,
                "offline": Liveness.OFFLINE,
            },
        )
        done = [code for (code,) in cursor.fetchall()]
    for code in done:
        Alert.objects.clear_for([code], *listening.MASS_LOSS_SUBJECT, at=now)


def alerts_of(node: Node) -> list[Alert]:
    """The open alerts about ``node``: its own, and the fleet's liveness alert that covers it (the node is
    in that alert's state with no alert of its own for it), for the node's page."""
    own = list(Alert.objects.open().filter(subject_type="node", subject_id=str(node.pk)))
    state_now = node.liveness_now
    code = next((c for c, state in FLEET_ALERTS.items() if state == state_now), None)
    if code is None or any(alert.code == code for alert in own):
        return own
    key = dedup_key_for(code, *listening.MASS_LOSS_SUBJECT)
    return own + list(Alert.objects.open().filter(dedup_key=key))


def _guard_mass_loss(
    census: _Census, clock: ListeningClock, before: datetime, now: datetime
) -> datetime | None:
    """The offline limit this sweep may apply: ``before``, or only the nodes an operator confirmed lost
    (``confirmed_at``), or none while many nodes went silent at once (the hold and its alert)."""
    confirmed = clock.confirmed_at
    due, alive, silent_since = census.due, census.alive, census.silent_since
    if not _many(due, alive):
        if clock.hold_since is not None:
            Alert.objects.clear_for([codes.ALERT_NODE_MASS_LOSS], *listening.MASS_LOSS_SUBJECT, at=now)
            clock.hold_since, clock.hold_nodes = None, 0
        return before
    if clock.hold_since is None:
        clock.hold_since = now
    clock.hold_nodes = due
    Alert.objects.raise_alert(
        codes.ALERT_NODE_MASS_LOSS,
        Severity.CRITICAL,
        *listening.MASS_LOSS_SUBJECT,
        "fleet liveness",
        f"{due} of {alive} online nodes went silent at once (last heard from "
        f"{timezone.localtime(silent_since):%Y-%m-%d %H:%M:%S %Z} on). The control plane suspects itself "
        "(its network, clock or database) rather than the fleet: they are held stale and no server is "
        "failed. If the nodes are really gone, confirm the loss (Alerts, or POST "
        "/api/v1/nodes/mass-loss/confirm); nodes that report again clear this.",
        at=now,
    )
    # Only nodes the operator already confirmed lost (silent before the confirmation) may go offline.
    return min(before, confirmed) if confirmed is not None else None
