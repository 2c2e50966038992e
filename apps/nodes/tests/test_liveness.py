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
    node.refresh_from_db()
    return node.liveness


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
