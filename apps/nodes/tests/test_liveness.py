"""Liveness: online → stale → offline by a set-based sweep; alerts raised once; a heartbeat clears them."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.alerts.models import Alert
from apps.nodes.liveness import SweepResult, sweep
from apps.nodes.models import Node
from apps.nodes.tests.factories import beat, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock():
    with time_machine.travel(timezone.now(), tick=False) as traveller:
        yield traveller


def sweeping(clock, seconds: float, step: float = 5) -> SweepResult:
    """Let ``seconds`` pass as they do in production: a sweep every ``step`` seconds (the beat's interval).
    A jump without sweeps would be a control plane that was away, which restarts every grace period."""
    total = SweepResult()
    passed = 0.0
    while passed < seconds:
        shift = min(step, seconds - passed)
        clock.shift(timedelta(seconds=shift))
        passed += shift
        moved = sweep()
        total.stale += moved.stale
        total.offline += moved.offline
    return total


def liveness(node: Node) -> str:
    """As it is now (the fleet's stale state included: models.liveness_now)."""
    return Node.objects.with_liveness().get(pk=node.pk).liveness_now


def test_heartbeats_with_jitter_up_to_twice_the_interval_never_flap_the_node(clock, settings):
    node, credential = make_node()
    beat(credential)
    # The agent's next heartbeat is due after 10 s; jitter may push it to 10 + 2x10 = 30 s.
    for _ in range(5):
        clock.shift(timedelta(seconds=3 * settings.HEARTBEAT_INTERVAL))
        assert sweep().stale == []
        assert liveness(node) == "online"
        beat(credential)
    assert not Alert.objects.exists()


def test_a_silent_node_goes_stale_then_offline_and_raises_its_alerts_once(clock, settings):
    node, credential = make_node(name="gpu-7")
    beat(credential)

    assert sweeping(clock, settings.NODE_STALE_AFTER + 1).stale == [(str(node.pk), "gpu-7")]
    assert liveness(node) == "stale"
    stale_alert = Alert.objects.open().get(code="NODE_STALE")
    assert (stale_alert.severity, stale_alert.subject_name) == ("warning", "gpu-7")
    assert not node.is_assignable()

    assert sweeping(clock, settings.NODE_OFFLINE_AFTER - settings.NODE_STALE_AFTER).offline == [
        (str(node.pk), "gpu-7")
    ]
    assert liveness(node) == "offline"
    offline_alert = Alert.objects.open().get(code="node_offline")
    assert offline_alert.severity == "critical"
    assert "gpu-7" in offline_alert.message

    # Sweeping again changes nothing and duplicates nothing.
    again = sweeping(clock, 60)
    assert (again.stale, again.offline) == ([], [])
    assert Alert.objects.filter(code="node_offline").count() == 1
    transitions = list(
        node.events.filter(kind="liveness").order_by("at", "id").values_list("from_liveness", "to_liveness")
    )
    assert transitions == [("pending", "online"), ("online", "stale"), ("stale", "offline")]


def test_the_next_heartbeat_clears_node_offline_and_brings_the_node_back(clock, settings):
    node, credential = make_node()
    beat(credential)
    sweeping(clock, settings.NODE_OFFLINE_AFTER + 1)
    assert liveness(node) == "offline"
    assert Alert.objects.open().filter(code="node_offline").exists()

    clock.shift(timedelta(seconds=5))
    assert beat(credential) is not None
    assert liveness(node) == "online"
    assert not Alert.objects.open().exists()
    cleared = Alert.objects.get(code="node_offline")
    assert cleared.cleared_at == timezone.now()
    assert node.is_assignable()
    assert node.events.filter(from_liveness="offline", to_liveness="online").exists()


def test_an_online_node_silent_past_both_limits_goes_straight_to_offline(clock, settings):
    node, credential = make_node()
    beat(credential)
    sweep()  # the control plane was listening all along: the sweep ran just now
    settings.LISTENING_GAP = settings.NODE_OFFLINE_AFTER + 10  # a long sweep interval, not an outage
    clock.shift(timedelta(seconds=settings.NODE_OFFLINE_AFTER + 1))
    result = sweep()
    assert result.offline and not result.stale
    assert node.events.filter(from_liveness="online", to_liveness="offline").exists()


def test_a_sweep_runs_no_stale_transition_when_the_offline_one_took_every_node_due_for_it(clock, settings):
    """Online nodes silent past both limits go straight to offline; the stale transition, with nothing left
    to move, is not run (over a whole fleet it scanned the node table for nothing)."""
    nodes = []
    for i in range(3):
        node, credential = make_node(name=f"both-{i}")
        beat(credential)
        nodes.append(node)
    lagging, lagging_credential = make_node(name="lagging")
    beat(lagging_credential)
    sweep()
    settings.LISTENING_GAP = settings.NODE_OFFLINE_AFTER + 10  # a long sweep interval, not an outage
    settings.LIVENESS_MASS_LOSS_MIN_NODES = 1000  # the guard is tested on its own
    clock.shift(timedelta(seconds=settings.NODE_OFFLINE_AFTER - 30))
    beat(lagging_credential)
    clock.shift(timedelta(seconds=31))  # the three past both limits, "lagging" past neither

    def transitions(queries: CaptureQueriesContext) -> list[str]:
        return [q["sql"] for q in queries.captured_queries if "SET liveness" in q["sql"]]

    with CaptureQueriesContext(connection) as queries:
        result = sweep()
    assert sorted(name for _, name in result.offline) == ["both-0", "both-1", "both-2"]
    assert result.stale == [] and len(transitions(queries)) == 1
    # With a node left past the stale limit only, the stale transition runs and moves it.
    clock.shift(timedelta(seconds=settings.NODE_STALE_AFTER - 30))
    with CaptureQueriesContext(connection) as queries:
        result = sweep()
    assert ([name for _, name in result.stale], result.offline) == (["lagging"], [])
    assert len(transitions(queries)) == 1
    assert [liveness(n) for n in nodes] == ["offline"] * 3 and liveness(lagging) == "stale"


def test_pending_nodes_are_not_swept(clock, settings):
    node, _ = make_node()
    clock.shift(timedelta(days=1))
    assert sweep().offline == []
    assert liveness(node) == "pending"


def test_the_sweep_is_set_based_its_statement_count_does_not_grow_with_nodes(clock, settings):
    # Regression guard: the sweep must stay one statement per transition, never a loop of saves.
    def statements_for(count: int, prefix: str) -> int:
        for i in range(count):
            _, credential = make_node(name=f"{prefix}-{i}")
            beat(credential)
        sweeping(clock, settings.NODE_OFFLINE_AFTER - 4)
        clock.shift(timedelta(seconds=5))
        with CaptureQueriesContext(connection) as queries:
            moved = sweep()
        assert len(moved.offline) == count
        return len(queries.captured_queries)

    settings.LIVENESS_MASS_LOSS_MIN_NODES = 1000  # the guard is tested on its own
    assert statements_for(1, "a") == statements_for(40, "b")


def test_a_sweep_of_many_nodes_writes_per_node_rows_in_as_many_statements_as_for_one(clock, settings):
    """Each node that goes offline gets its event row and one node_offline alert, and each server on it
    that was live is failed with its own event row; the statements do not grow with the nodes."""
    from apps.nodes.models import NodeEvent
    from apps.servers.models import ModelServer, ServerEvent

    settings.LIVENESS_MASS_LOSS_MIN_NODES = 1000  # the guard is tested on its own

    def sweep_of(count: int, prefix: str) -> int:
        nodes = []
        for i in range(count):
            node, credential = make_node(name=f"{prefix}-{i}")
            beat(credential)
            nodes.append(node)
            for state in ("running", "starting", "stopped"):
                ModelServer.objects.create(
                    name=f"{prefix}-{i}-{state}", profile="test-echo", model="m", node=node, state=state
                )
        sweeping(clock, settings.NODE_OFFLINE_AFTER - 4)
        clock.shift(timedelta(seconds=5))
        with CaptureQueriesContext(connection) as queries:
            moved = sweep()
        ids = {str(node.pk) for node in nodes}
        assert {node_id for node_id, _ in moved.offline} == ids
        assert sorted(name for _, name in moved.offline) == sorted(node.name for node in nodes)
        offline = Alert.objects.open().filter(code="node_offline", subject_id__in=ids)
        assert sorted(offline.values_list("subject_id", flat=True)) == sorted(ids)  # one per node
        assert all(a.message.startswith(f"Node {a.subject_name} is offline") for a in offline)
        events = NodeEvent.objects.filter(node__in=nodes, kind="liveness", to_liveness="offline")
        assert sorted(str(e.node_id) for e in events) == sorted(ids)  # one per node
        servers = ModelServer.objects.filter(node__in=nodes)
        failed = servers.filter(state="failed", failure_code="NODE_OFFLINE")
        assert failed.count() == 2 * count
        assert servers.filter(state="stopped").count() == count  # not live: untouched
        assert ServerEvent.objects.filter(server__in=failed, to_state="failed").count() == 2 * count
        return len(queries.captured_queries)

    assert sweep_of(1, "a") == sweep_of(30, "b")
    # Sweeping again moves nothing and opens no second alert.
    clock.shift(timedelta(seconds=5))
    assert sweep().offline == []
    assert Alert.objects.filter(code="node_offline").count() == 31
    assert Alert.objects.filter(code="node_offline", occurrences=1).count() == 31


def test_heartbeats_and_transitions_change_no_indexed_column_of_the_node_row():
    """The node row is updated in place (HOT) only while no index covers what a heartbeat or a sweep
    writes (migration 0003)."""
    written = {
        "last_heartbeat_at",
        "liveness",
        "agent_version",
        "agent_url",
        "accelerator",
        "cpu_count",
        "load_1m",
        "memory_total_bytes",
        "memory_available_bytes",
        "shm_total_bytes",
        "shm_free_bytes",
        "models_present",
    }
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT DISTINCT a.attname FROM pg_index i
            JOIN pg_attribute a ON a.attrelid = i.indrelid
             AND (a.attnum = ANY(i.indkey)
                  OR pg_get_expr(i.indpred, i.indrelid) LIKE '%%' || a.attname || '%%'
                  OR pg_get_expr(i.indexprs, i.indrelid) LIKE '%%' || a.attname || '%%')
            WHERE i.indrelid = 'nodes_node'::regclass AND a.attnum > 0
            """
        )
        indexed = {name for (name,) in cursor.fetchall()}
    assert "credential_hash" in indexed  # the query sees the table's indexes
    assert indexed & written == set()


def test_a_sweep_moving_every_node_at_once_rewrites_each_row_in_place(clock, settings):
    """Half of each node-table page is left free at insert (migration 0005), so a sweep that moves a whole
    fleet at once -- every row of every page -- is HOT: no row moves to another page, no index entry is
    written. On full pages most of those rows moved, each with an entry in every index."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'nodes_node'::regclass")
        assert cursor.fetchone()[0] == ["fillfactor=50"]
    Node.objects.bulk_create(
        Node(
            name=f"fleet-{i}",
            accelerator="cpu",
            credential_hash=f"{i:064x}",
            liveness="online",
            last_heartbeat_at=timezone.now() - timedelta(hours=1),
        )
        for i in range(300)
    )

    def hot_and_all() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_stat_get_xact_tuples_hot_updated('nodes_node'::regclass),"
                " pg_stat_get_xact_tuples_updated('nodes_node'::regclass)"
            )
            return cursor.fetchone()

    settings.LIVENESS_MASS_LOSS_MIN_NODES = 10**9  # the guard off: every node goes
    hot_before, updated_before = hot_and_all()
    moved = sweep()
    hot_after, updated_after = hot_and_all()
    assert len(moved.offline) == 300
    assert updated_after - updated_before == 300
    assert hot_after - hot_before == 300


def test_only_enabled_online_fresh_nodes_are_assignable(clock, settings):
    online, c1 = make_node(name="online")
    _, c2 = make_node(name="disabled", enabled=False)
    make_node(name="pending")
    beat(c1)
    beat(c2)
    assert list(Node.objects.assignable().values_list("name", flat=True)) == ["online"]
    # A heartbeat older than the stale limit is not a reading, even before the sweep runs.
    clock.shift(timedelta(seconds=settings.NODE_STALE_AFTER + 1))
    assert not online.is_assignable()
    assert not Node.objects.assignable().exists()


def test_a_sweep_moving_many_nodes_at_once_writes_one_alert_for_any_number_of_them(clock, settings):
    """A whole fleet going stale in one sweep: each node its state, one event row and one NODE_STALE for
    all (apps/nodes/liveness.py); the statements and the rows written do not grow with the nodes."""
    from apps.nodes.models import NodeEvent, events_of

    def mass_sweep_of(count: int, prefix: str) -> int:
        nodes = []
        for i in range(count):
            node, credential = make_node(name=f"{prefix}-{i}")
            beat(credential)
            nodes.append(node)
        sweeping(clock, settings.NODE_STALE_AFTER - 4)
        clock.shift(timedelta(seconds=5))
        with CaptureQueriesContext(connection) as queries:
            moved = sweep()
        assert sorted(name for _, name in moved.stale) == sorted(node.name for node in nodes)
        assert Node.objects.filter(pk__in=[n.pk for n in nodes]).in_liveness("stale").count() == count
        # Held as one fleet state: no node row was written (each column still says online).
        assert Node.objects.filter(pk__in=[n.pk for n in nodes], liveness="online").count() == count
        # One event row for the fleet, naming every node; each node's history shows it.
        assert not NodeEvent.objects.filter(node__in=nodes, to_liveness="stale").exists()
        (event,) = NodeEvent.objects.filter(node__isnull=True, to_liveness="stale")
        assert sorted(event.nodes or []) == sorted(n.pk for n in nodes)
        assert (event.from_liveness, event.fleet_size) == ("online", count)
        assert event.detail.endswith(f"({count} nodes at once)")
        assert [e.pk for e in events_of(nodes[-1]).filter(to_liveness="stale")] == [event.pk]
        NodeEvent.objects.filter(pk=event.pk).delete()
        assert not Alert.objects.filter(subject_type="node").exists()
        (alert,) = Alert.objects.open().filter(code="NODE_STALE")
        assert alert.subject_type == "fleet"
        assert alert.message.startswith(f"{count} of {count} nodes went stale at once")
        Alert.objects.all().delete()
        Node.objects.filter(pk__in=[n.pk for n in nodes]).delete()
        return len(queries.captured_queries)

    assert mass_sweep_of(3, "a") == mass_sweep_of(40, "b")
