"""Silence is counted only while the control plane was listening; many nodes silent at once are held.

Written against the refusals of issue 12: a restore, a control-plane restart or a database outage
longer than the offline limit must not take a healthy node offline, and a mass loss is the control
plane's suspicion of itself until an operator confirms it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.alerts.models import Alert
from apps.nodes import listening
from apps.nodes.liveness import sweep
from apps.nodes.models import ListeningClock, Node, events_of
from apps.nodes.tests.factories import beat, make_node
from apps.nodes.tests.test_liveness import sweeping
from apps.servers.models import ModelServer
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock():
    with time_machine.travel(timezone.now(), tick=False) as traveller:
        yield traveller


def states() -> dict[str, str]:
    """Each node's liveness as it is now (the fleet's stale state included: models.liveness_now)."""
    return {node.name: node.liveness_now for node in Node.objects.with_liveness()}


def fleet(count: int) -> list[str]:
    credentials = []
    for i in range(count):
        _, credential = make_node(name=f"n{i}")
        beat(credential)
        credentials.append(credential)
    return credentials


def test_sweeps_resuming_after_a_gap_give_every_node_a_full_grace_period(clock, settings):
    (credential,) = fleet(1)
    sweep()
    # The worker (or beat, broker, database) is away for longer than the offline limit.
    clock.shift(timedelta(seconds=settings.NODE_OFFLINE_AFTER * 2))
    assert sweep().offline == [] and sweep().stale == []
    assert states() == {"n0": "online"}
    reason = ListeningClock.objects.get().listening_reason
    assert "no liveness sweep for" in reason
    # Silence now counts from the resumption: stale after the stale limit, offline after the offline limit.
    assert sweeping(clock, settings.NODE_STALE_AFTER - 5).stale == []
    assert [n for _, n in sweeping(clock, 10).stale] == ["n0"]
    assert [
        n for _, n in sweeping(clock, settings.NODE_OFFLINE_AFTER - settings.NODE_STALE_AFTER).offline
    ] == ["n0"]
    beat(credential)
    assert states() == {"n0": "online"}


def test_a_node_reporting_within_its_new_grace_period_never_goes_offline(clock, settings):
    (credential,) = fleet(1)
    sweep()
    clock.shift(timedelta(seconds=300))  # the database was down; the agent backed off meanwhile
    sweeping(clock, settings.NODE_STALE_AFTER - 5)
    beat(credential)  # its back-off (at most three intervals) ends inside the grace period
    sweeping(clock, settings.NODE_OFFLINE_AFTER - 10)
    assert states() == {"n0": "stale"}  # silent again since that heartbeat, but never offline
    assert not Alert.objects.filter(code="node_offline").exists()


def test_no_web_process_listening_holds_every_transition(clock, settings):
    fleet(1)
    listening.web_tick()
    sweep()
    # Every web process is gone (the stamps stop); the worker keeps sweeping.
    moved = sweeping(clock, settings.NODE_OFFLINE_AFTER * 2)
    assert (moved.stale, moved.offline) == ([], [])
    assert states() == {"n0": "online"}
    assert ListeningClock.objects.get().listening_reason == "no web process listening"
    # The web processes come back: their first stamp restarts the grace period.
    listening.web_tick()
    row = ListeningClock.objects.get()
    assert row.listening_since == timezone.now()
    assert row.listening_reason == "web processes started listening after a gap"


def test_web_stamps_without_a_gap_do_not_move_listening_since(clock, settings):
    listening.web_tick()
    first = ListeningClock.objects.get().listening_since
    clock.shift(timedelta(seconds=5))
    with CaptureQueriesContext(connection) as queries:
        listening.web_tick()
    row = ListeningClock.objects.get()
    assert row.listening_since == first and row.web_seen_at == timezone.now()
    assert len(queries) == 1  # the usual stamp is one statement


def test_a_restore_switch_over_restarts_the_grace_period_of_restored_nodes(clock, settings):
    (credential,) = fleet(1)
    sweep()
    # What a restore does: the books come back with a heartbeat as old as the backup.
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(hours=20))
    listening.resumed("restore 7 switched the database over")
    moved = sweeping(clock, settings.NODE_STALE_AFTER - 5)
    assert (moved.stale, moved.offline) == ([], [])
    # The gateway keeps routing to it meanwhile: the node is heard, though its reading is old.
    assert Node.objects.heard().filter(name="n0").exists()
    assert not Node.objects.assignable().filter(name="n0").exists()  # placement still wants a reading
    beat(credential)
    assert Node.objects.assignable().filter(name="n0").exists()


def test_two_of_three_nodes_silent_at_once_are_held_stale_with_one_critical_alert(clock, settings):
    credentials = fleet(3)
    sweep()
    server = ModelServer.objects.create(
        name="on-n0", profile="test-echo", model="m", node=Node.objects.get(name="n0"), state="running"
    )
    for _ in range(int(settings.NODE_OFFLINE_AFTER / 5) + 4):
        clock.shift(timedelta(seconds=5))
        beat(credentials[2])  # only n2 still reports
        sweep()
    assert states() == {"n0": "stale", "n1": "stale", "n2": "online"}
    server.refresh_from_db()
    assert server.state == "running"
    (alert,) = Alert.objects.open().filter(code="NODE_MASS_LOSS")
    assert alert.severity == "critical"
    assert alert.message.startswith("2 of 3 online nodes went silent at once")
    assert not Alert.objects.filter(code="node_offline").exists()
    assert ListeningClock.objects.get().hold_nodes == 2

    confirmed = listening.confirm_mass_loss(by="alice")
    assert (confirmed.confirmed_by, confirmed.hold_since) == ("alice", None)
    assert not Alert.objects.open().filter(code="NODE_MASS_LOSS").exists()
    with pytest.raises(ApiError) as refused:
        listening.confirm_mass_loss(by="alice")  # nothing is held any more
    assert refused.value.code == "NODE_MASS_LOSS_NOT_HELD"

    clock.shift(timedelta(seconds=5))
    beat(credentials[2])
    moved = sweep()
    assert sorted(n for _, n in moved.offline) == ["n0", "n1"]
    server.refresh_from_db()
    assert (server.state, server.failure_code) == ("failed", "NODE_OFFLINE")
    # Two of three at once: one node_offline for both (below), each with its own state and event.
    (offline,) = Alert.objects.open().filter(code="node_offline")
    assert offline.subject_type == "fleet" and offline.message.startswith("2 of 3 nodes went offline at once")


def test_a_fleet_silent_at_once_with_spread_heartbeats_is_held_not_taken_offline_one_by_one(clock, settings):
    """Each agent beats on its own phase: nodes that went silent together cross the offline limit in
    different sweeps. Judged one sweep at a time, the first to cross was one of four, then one of three...
    and the whole fleet went offline one node at a time. Silence past the stale limit is what is judged."""
    credentials = fleet(4)
    sweep()
    # The control plane's network goes at t = 0: the nodes' last heartbeats were 0, 1, 2 and 3 s before.
    for credential in credentials:
        clock.shift(timedelta(seconds=1))
        beat(credential)
    moved = sweeping(clock, settings.NODE_OFFLINE_AFTER + 10, step=1)
    assert moved.offline == []
    assert states() == {"n0": "stale", "n1": "stale", "n2": "stale", "n3": "stale"}
    (alert,) = Alert.objects.open().filter(code="NODE_MASS_LOSS")
    assert alert.message.startswith("4 of 4 online nodes went silent at once")
    assert not Alert.objects.filter(code="node_offline").exists()


def test_nodes_that_come_back_clear_the_hold(clock, settings):
    credentials = fleet(3)
    sweep()
    for _ in range(int(settings.NODE_OFFLINE_AFTER / 5) + 2):
        clock.shift(timedelta(seconds=5))
        beat(credentials[2])
        sweep()
    assert Alert.objects.open().filter(code="NODE_MASS_LOSS").exists()
    for credential in credentials:
        beat(credential)
    sweep()
    assert not Alert.objects.open().filter(code="NODE_MASS_LOSS").exists()
    assert states() == {"n0": "online", "n1": "online", "n2": "online"}
    assert ListeningClock.objects.get().hold_since is None


def test_one_of_three_silent_is_an_ordinary_offline(clock, settings):
    credentials = fleet(3)
    sweep()
    for _ in range(int(settings.NODE_OFFLINE_AFTER / 5) + 2):
        clock.shift(timedelta(seconds=5))
        beat(credentials[1])
        beat(credentials[2])
        sweep()
    assert states() == {"n0": "offline", "n1": "online", "n2": "online"}
    assert not Alert.objects.filter(code="NODE_MASS_LOSS").exists()


def test_a_fleet_smaller_than_the_minimum_is_never_held(clock, settings):
    fleet(2)
    sweep()
    sweeping(clock, settings.NODE_OFFLINE_AFTER + 5)
    assert states() == {"n0": "offline", "n1": "offline"}
    assert not Alert.objects.filter(code="NODE_MASS_LOSS").exists()


# --- Many nodes moved in one sweep: one alert for them all (issue 17) --------------------------------


def open_alerts(code: str) -> list[Alert]:
    return list(Alert.objects.open().filter(code=code))


def test_many_nodes_going_stale_at_once_raise_one_fleet_alert_and_each_keeps_its_state_and_event(
    clock, settings
):
    credentials = fleet(4)
    sweep()
    for _ in range(int(settings.NODE_STALE_AFTER / 5) + 1):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])  # only n3 still reports: 3 of 4 go stale in one sweep
        sweep()
    assert states() == {"n0": "stale", "n1": "stale", "n2": "stale", "n3": "online"}
    # Each node still has its own state and, in its history, the event that says why: one row for the
    # three (a transition of many nodes at once), naming each.
    for name in ("n0", "n1", "n2"):
        (event,) = events_of(Node.objects.get(name=name)).filter(to_liveness="stale")
        assert (event.from_liveness, event.detail, event.fleet_size) == (
            "online",
            f"no heartbeat for more than {settings.NODE_STALE_AFTER} s (3 nodes at once)",
            3,
        )
    assert not events_of(Node.objects.get(name="n3")).filter(to_liveness="stale").exists()
    # One NODE_STALE for the fleet, not one per node.
    (alert,) = open_alerts("NODE_STALE")
    assert (alert.severity, alert.subject_type, alert.subject_id) == ("warning", "fleet", "liveness")
    assert alert.dedup_key == "NODE_STALE:fleet:liveness"
    assert alert.message.startswith("3 of 4 nodes went stale at once")
    assert "n0, n1, n2" in alert.message and "liveness: stale" in alert.message
    # Sweeping on changes nothing and opens nothing new; one node coming back does not clear it.
    clock.shift(timedelta(seconds=5))
    beat(credentials[3])
    beat(credentials[0])
    sweep()
    assert [a.pk for a in open_alerts("NODE_STALE")] == [alert.pk]
    # Once none of them is stale, the next sweep clears it.
    beat(credentials[1])
    beat(credentials[2])
    sweep()
    assert open_alerts("NODE_STALE") == []
    alert.refresh_from_db()
    assert alert.cleared_at == timezone.now()


def test_a_confirmed_mass_loss_goes_offline_under_one_critical_alert_and_each_server_fails(clock, settings):
    credentials = fleet(4)
    sweep()
    servers = [
        ModelServer.objects.create(
            name=f"on-n{i}",
            profile="test-echo",
            model="m",
            node=Node.objects.get(name=f"n{i}"),
            state="running",
        )
        for i in range(3)
    ]
    for _ in range(int(settings.NODE_OFFLINE_AFTER / 5) + 2):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])
        sweep()
    assert open_alerts("NODE_MASS_LOSS") and len(open_alerts("NODE_STALE")) == 1
    listening.confirm_mass_loss(by="alice")
    clock.shift(timedelta(seconds=5))
    beat(credentials[3])
    moved = sweep()
    assert sorted(n for _, n in moved.offline) == ["n0", "n1", "n2"]
    assert states() == {"n0": "offline", "n1": "offline", "n2": "offline", "n3": "online"}
    for server in servers:  # the servers' reaction is per node, as before
        server.refresh_from_db()
        assert (server.state, server.failure_code) == ("failed", "NODE_OFFLINE")
    (alert,) = open_alerts("node_offline")
    assert (alert.severity, alert.subject_type, alert.subject_name) == ("critical", "fleet", "fleet liveness")
    assert alert.message.startswith("3 of 4 nodes went offline at once")
    assert open_alerts("NODE_STALE") == []  # none of them is stale any more
    # node_offline clears itself once every node it covers has reported again.
    for credential in credentials[:2]:
        beat(credential)
    clock.shift(timedelta(seconds=5))
    sweep()
    assert len(open_alerts("node_offline")) == 1
    beat(credentials[2])
    sweep()
    assert open_alerts("node_offline") == []


def test_a_node_going_stale_alone_beside_an_open_fleet_alert_gets_its_own(clock, settings):
    credentials = fleet(5)
    sweep()
    for _ in range(int(settings.NODE_STALE_AFTER / 5) + 1):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])
        beat(credentials[4])
        sweep()  # n0, n1, n2: 3 of 5 at once
    assert [a.subject_type for a in open_alerts("NODE_STALE")] == ["fleet"]
    for _ in range(int(settings.NODE_STALE_AFTER / 5) + 1):
        clock.shift(timedelta(seconds=5))
        beat(credentials[4])
        sweep()  # n3 alone
    n3 = Node.objects.get(name="n3")
    assert sorted((a.subject_type, a.subject_name) for a in open_alerts("NODE_STALE")) == [
        ("fleet", "fleet liveness"),
        ("node", "n3"),
    ]
    # The fleet alert clears when the three it covers are back, though n3 is still stale.
    for credential in credentials[:3]:
        beat(credential)
    clock.shift(timedelta(seconds=1))
    sweep()
    assert [(a.subject_type, a.subject_id) for a in open_alerts("NODE_STALE")] == [("node", str(n3.pk))]


def test_a_node_page_shows_the_fleet_alert_that_covers_it(clock, settings, client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("ops", is_staff=True))
    credentials = fleet(4)
    sweep()
    for _ in range(int(settings.NODE_STALE_AFTER / 5) + 1):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])
        sweep()
    assert len(open_alerts("NODE_STALE")) == 1
    covered = client.get(f"/nodes/{Node.objects.get(name='n0').pk}/").content.decode()
    assert "<code>NODE_STALE</code>" in covered and "3 of 4 nodes went stale at once" in covered
    online = client.get(f"/nodes/{Node.objects.get(name='n3').pk}/").content.decode()
    assert "<code>NODE_STALE</code>" not in online


# --- The fleet's stale state: many nodes at once, one timestamp, no row per node (issue 17) -----------


def row_versions() -> dict[str, str]:
    """Each node row's version (``xmin`` changes whenever the row is written)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, xmin::text FROM nodes_node")
        return dict(cursor.fetchall())


def fleet_stale_of(credentials: list[str], clock, settings, reporting: int = 3) -> None:
    """Let every node but ``credentials[reporting:]`` fall silent past the stale limit, swept as usual."""
    for _ in range(int(settings.NODE_STALE_AFTER / 5) + 1):
        clock.shift(timedelta(seconds=5))
        for credential in credentials[reporting:]:
            beat(credential)
        sweep()


def test_many_nodes_going_stale_at_once_write_no_node_row_and_one_reporting_again_is_online(clock, settings):
    credentials = fleet(4)
    sweep()
    before = row_versions()
    for _ in range(int(settings.NODE_STALE_AFTER / 5) + 1):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])
        moved = sweep()
        if moved.stale:
            break
    assert sorted(n for _, n in moved.stale) == ["n0", "n1", "n2"]
    after = row_versions()
    assert [after[n] == before[n] for n in ("n0", "n1", "n2")] == [True, True, True]  # no row version
    assert states() == {"n0": "stale", "n1": "stale", "n2": "stale", "n3": "online"}
    assert ListeningClock.objects.get().fleet_stale_before == timezone.now() - timedelta(
        seconds=settings.NODE_STALE_AFTER
    )
    # Sweeping on writes no second event for the nodes already held stale.
    fleet_events = events_of(Node.objects.get(name="n0")).filter(to_liveness="stale")
    for _ in range(3):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])
        assert sweep().stale == []
    assert fleet_events.count() == 1
    # A node that reports again is online at once, with the event that says it came back from stale.
    beat(credentials[0])
    assert states()["n0"] == "online"
    (back,) = events_of(Node.objects.get(name="n0")).filter(to_liveness="online", from_liveness="stale")
    assert back.detail == "heartbeat"
    # Once none is held by it, the next sweep clears the fleet's state (its statements read the bare column).
    beat(credentials[1])
    sweep()
    assert ListeningClock.objects.get().fleet_stale_before is not None  # n2 is still held
    beat(credentials[2])
    sweep()
    assert ListeningClock.objects.get().fleet_stale_before is None
    assert states() == {"n0": "online", "n1": "online", "n2": "online", "n3": "online"}


def test_a_node_held_stale_by_the_fleet_goes_offline_from_stale_when_it_is_not_many(clock, settings):
    credentials = fleet(4)
    sweep()
    fleet_stale_of(credentials, clock, settings)
    beat(credentials[0])  # n0 back: two of four silent is not more than half, so they go offline
    offline: list[tuple[str, str]] = []
    for _ in range(int((settings.NODE_OFFLINE_AFTER - settings.NODE_STALE_AFTER) / 5) + 2):
        clock.shift(timedelta(seconds=5))
        beat(credentials[0])
        beat(credentials[3])
        offline += sweep().offline
    assert sorted(n for _, n in offline) == ["n1", "n2"]
    assert states() == {"n0": "online", "n1": "offline", "n2": "offline", "n3": "online"}
    for name in ("n1", "n2"):
        (event,) = events_of(Node.objects.get(name=name)).filter(to_liveness="offline")
        assert event.from_liveness == "stale"  # as it was, though its column still said online
    assert not Alert.objects.open().filter(code="NODE_STALE").exists()  # none of them is stale any more


def test_nodes_in_the_fleet_stale_state_are_stale_to_every_reader(clock, settings, operator_client, client):
    from django.contrib.auth.models import User

    credentials = fleet(4)
    sweep()
    fleet_stale_of(credentials, clock, settings)
    # Routing after a control-plane restart (their old heartbeat forgiven) and the reconcile's online nodes.
    listening.resumed("the control plane restarted")
    assert list(Node.objects.heard().values_list("name", flat=True)) == ["n3"]
    assert list(Node.objects.in_liveness("online").values_list("name", flat=True)) == ["n3"]
    # The API: the field and the filter.
    listed = operator_client.get("/api/v1/nodes").json()["results"]
    assert {n["name"]: n["liveness"] for n in listed} == {
        "n0": "stale",
        "n1": "stale",
        "n2": "stale",
        "n3": "online",
    }
    stale = operator_client.get("/api/v1/nodes?liveness=stale").json()["results"]
    assert [n["name"] for n in stale] == ["n0", "n1", "n2"]
    one = Node.objects.get(name="n1")
    assert operator_client.get(f"/api/v1/nodes/{one.pk}").json()["liveness"] == "stale"
    # The dashboard's list, its filter and a node's page; the metrics gauge.
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/nodes/?liveness=stale").content.decode()
    assert page.count('<span class="badge badge-stale">stale</span>') == 3 and ">n3</a>" not in page
    assert '<span class="badge badge-stale">stale</span>' in client.get(f"/nodes/{one.pk}/").content.decode()
    from apps.nodes.contributions import NodesCollector, overview

    (gauge,) = NodesCollector().collect()
    assert {s.labels["liveness"]: s.value for s in gauge.samples} == {"stale": 3, "online": 1}
    assert overview()["liveness"] == {"stale": 3, "online": 1}


def test_a_confirmed_mass_loss_goes_offline_without_a_node_row_and_a_node_reporting_again_is_online(
    clock, settings, operator_client
):
    credentials = fleet(4)
    sweep()
    server = ModelServer.objects.create(
        name="on-n1", profile="test-echo", model="m", node=Node.objects.get(name="n1"), state="running"
    )
    before = row_versions()
    for _ in range(int(settings.NODE_OFFLINE_AFTER / 5) + 2):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])
        sweep()
    assert states() == {"n0": "stale", "n1": "stale", "n2": "stale", "n3": "online"}  # held
    confirmed = listening.confirm_mass_loss(by="alice").confirmed_at
    clock.shift(timedelta(seconds=5))
    beat(credentials[3])
    moved = sweep()
    assert sorted(n for _, n in moved.offline) == ["n0", "n1", "n2"]
    after = row_versions()
    assert [after[n] == before[n] for n in ("n0", "n1", "n2")] == [True, True, True]  # no row version
    assert states() == {"n0": "offline", "n1": "offline", "n2": "offline", "n3": "online"}
    limit = timezone.now() - timedelta(seconds=settings.NODE_OFFLINE_AFTER)
    assert confirmed is not None
    assert ListeningClock.objects.get().fleet_offline_before == min(limit, confirmed)
    server.refresh_from_db()
    assert (server.state, server.failure_code) == ("failed", "NODE_OFFLINE")
    (event,) = events_of(Node.objects.get(name="n1")).filter(to_liveness="offline")
    assert (event.from_liveness, event.fleet_size) == ("stale", 3)
    offline = operator_client.get("/api/v1/nodes?liveness=offline").json()["results"]
    assert [n["name"] for n in offline] == ["n0", "n1", "n2"]
    # Sweeping on moves nothing more, and the one node left is the whole fleet the guard weighs now.
    for _ in range(3):
        clock.shift(timedelta(seconds=5))
        beat(credentials[3])
        assert (sweep().offline, sweep().stale) == ([], [])
    assert events_of(Node.objects.get(name="n1")).filter(to_liveness="offline").count() == 1
    # A node that reports again is online at once, and says where it came back from.
    beat(credentials[1])
    assert states()["n1"] == "online"
    assert (
        events_of(Node.objects.get(name="n1")).filter(from_liveness="offline", to_liveness="online").exists()
    )
