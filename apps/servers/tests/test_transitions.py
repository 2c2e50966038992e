"""Model servers move through StatefulModel.transition() (apps/core/transitions.py), as before: allowed
moves, compare-and-swap, an event row, running_at/stopped_at, reservations released outside HOLDING."""

from __future__ import annotations

import pytest

from apps.servers.choices import TRANSITIONS, ServerState
from apps.servers.lifecycle import OFFLINE_SWEPT
from apps.servers.models import ModelServer, Reservation
from apps.servers.tests.factories import cpu_node
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


def test_every_state_the_offline_sweep_fails_may_become_failed():
    # The sweep writes state in one statement, around transition(): it must not make a move refused there.
    assert all(ServerState.FAILED in TRANSITIONS[state] for state in OFFLINE_SWEPT)


def test_a_server_moves_with_its_event_row_times_and_reservations():
    node = cpu_node("n1")
    server = ModelServer.objects.create(name="echo", profile="p", model="m", node=node, state="starting")
    Reservation.objects.create(server=server, node=node, bytes=1)
    server.transition(ServerState.RUNNING, detail="up")
    assert server.running_at is not None and Reservation.objects.filter(server=server).exists()
    server.transition(ServerState.FAILED, detail="gone", failure_code="PROCESS_LOST")
    server.refresh_from_db()
    assert (server.state, server.failure_code) == ("failed", "PROCESS_LOST")
    assert server.stopped_at is not None
    assert not Reservation.objects.filter(server=server).exists()
    assert [(e.from_state, e.to_state) for e in server.events.order_by("id")] == [
        ("starting", "running"),
        ("running", "failed"),
    ]


def test_a_server_refuses_a_move_it_does_not_allow_and_one_made_meanwhile():
    server = ModelServer.objects.create(name="echo", profile="p", model="m", state="stopped")
    with pytest.raises(ApiError) as refused:
        server.transition(ServerState.RUNNING)
    assert refused.value.message == "Server echo is stopped; it cannot become running."
    running = ModelServer.objects.create(name="live", profile="p", model="m", state="running")
    stale = ModelServer.objects.get(pk=running.pk)
    running.transition(ServerState.STOPPING)
    with pytest.raises(ApiError) as refused:
        stale.transition(ServerState.FAILED)
    assert (refused.value.code, refused.value.status) == ("INVALID_SERVER_STATE", 409)
    assert refused.value.message == "Server live changed to stopping meanwhile; it cannot become failed."
