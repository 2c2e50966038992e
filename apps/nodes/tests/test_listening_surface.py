"""The listening clock and the mass-loss hold in the API, the dashboard and the admin: read the clock,
confirm a held loss (the alert clears), and a confirmation with nothing held is refused by name."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.nodes import codes, listening
from apps.nodes.models import ListeningClock

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


@pytest.fixture
def superuser(client):
    client.force_login(User.objects.create_superuser("root-ops", email="", password="x-long-password-1"))
    return client


def hold(nodes: int = 3) -> ListeningClock:
    """A mass loss held as the liveness sweep holds it: the clock's hold and one open NODE_MASS_LOSS."""
    now = timezone.now()
    clock = listening.current()
    clock.listening_since = now - timedelta(hours=1)
    clock.listening_reason = "web processes started listening after a gap"
    clock.hold_since = now - timedelta(minutes=2)
    clock.hold_nodes = nodes
    clock.save()
    Alert.objects.raise_alert(
        codes.ALERT_NODE_MASS_LOSS,
        Severity.CRITICAL,
        *listening.MASS_LOSS_SUBJECT,
        "fleet liveness",
        f"{nodes} of 4 online nodes went silent at once.",
    )
    return clock


def mass_loss_open() -> bool:
    return Alert.objects.open().filter(code="NODE_MASS_LOSS").exists()


# --- API ------------------------------------------------------------------------------------------


def test_the_listening_clock_is_read_and_not_taken_for_a_node_id(operator_client):
    hold(nodes=3)
    response = operator_client.get("/api/v1/nodes/listening")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {
        "listening_since",
        "listening_reason",
        "web_seen_at",
        "swept_at",
        "hold_since",
        "hold_nodes",
        "confirmed_at",
        "confirmed_by",
        "fleet_stale_before",
        "fleet_offline_before",
    }
    assert body["listening_reason"] == "web processes started listening after a gap"
    assert body["hold_nodes"] == 3 and body["hold_since"] is not None


def test_the_listening_clock_and_the_confirmation_need_an_operator(anonymous_client):
    assert anonymous_client.get("/api/v1/nodes/listening").status_code == 401
    assert anonymous_client.post("/api/v1/nodes/mass-loss/confirm").status_code == 401


def test_confirming_with_nothing_held_is_node_mass_loss_not_held(operator_client):
    response = operator_client.post("/api/v1/nodes/mass-loss/confirm")
    assert response.status_code == 409
    assert set(response.json()) == {"code", "message", "correlation_id"}
    assert response.json()["code"] == "NODE_MASS_LOSS_NOT_HELD"
    assert listening.current().confirmed_at is None


def test_confirming_a_held_loss_records_who_and_clears_the_alert(operator_client):
    hold()
    assert mass_loss_open()
    response = operator_client.post("/api/v1/nodes/mass-loss/confirm")
    assert response.status_code == 200
    body = response.json()
    assert (body["hold_since"], body["hold_nodes"], body["confirmed_by"]) == (None, 0, "operator-api-key")
    assert body["confirmed_at"] is not None
    assert not mass_loss_open()
    assert operator_client.post("/api/v1/nodes/mass-loss/confirm").json()["code"] == "NODE_MASS_LOSS_NOT_HELD"
    assert operator_client.get("/api/v1/nodes/mass-loss/confirm").status_code == 405


def test_the_schema_describes_the_listening_operations(operator_client):
    paths = operator_client.get("/api/v1/schema/?format=json").json()["paths"]
    assert "get" in paths["/api/v1/nodes/listening"]
    assert "post" in paths["/api/v1/nodes/mass-loss/confirm"]


# --- Dashboard ------------------------------------------------------------------------------------


def test_the_alerts_page_offers_to_confirm_a_held_loss(staff):
    hold()
    page = staff.get("/alerts/").content.decode()
    assert 'action="/nodes/mass-loss/confirm"' in page and ">Confirm the loss</button>" in page
    response = staff.post("/nodes/mass-loss/confirm", {"next": "/alerts/?open=true"})
    assert response.status_code == 302 and response["Location"] == "/alerts/?open=true"
    page = staff.get(response["Location"]).content.decode()
    assert "Mass node loss confirmed" in page
    assert ">Confirm the loss</button>" not in page
    assert not mass_loss_open()
    assert listening.current().confirmed_by == "ops"
    cleared = staff.get("/alerts/?open=false").content.decode()
    assert "NODE_MASS_LOSS" in cleared and ">Confirm the loss</button>" not in cleared


def test_a_confirmation_with_nothing_held_is_a_message_not_an_error(staff):
    page = staff.post("/nodes/mass-loss/confirm", {"next": "https://elsewhere.example/"}, follow=True)
    assert page.status_code == 200
    assert page.redirect_chain[-1][0] == "/nodes/"  # never redirected off the site
    assert "NODE_MASS_LOSS_NOT_HELD: No mass loss is being held" in page.content.decode()
    assert staff.get("/nodes/mass-loss/confirm").status_code == 405


def test_the_node_list_shows_the_listening_clock_and_the_hold(staff):
    page = staff.get("/nodes/").content.decode()
    assert "has not started listening yet" in page and 'id="mass-loss"' not in page
    assert not ListeningClock.objects.exists()  # a page view does not start the clock
    hold(nodes=7)
    page = staff.get("/nodes/").content.decode()
    assert 'id="listening"' in page and "Listening since" in page
    assert "web processes started listening after a gap" in page
    assert (
        'id="mass-loss"' in page and "7 node(s) held stale" in page and ">Confirm the loss</button>" in page
    )
    staff.post("/nodes/mass-loss/confirm", {"next": "/nodes/"})
    page = staff.get("/nodes/").content.decode()
    assert 'id="mass-loss"' not in page and "Last mass loss confirmed by ops" in page


# --- Admin ----------------------------------------------------------------------------------------


def test_the_clock_is_read_only_in_the_admin_with_a_confirm_action(superuser):
    clock = hold()
    changelist = "/admin/nodes/listeningclock/"
    page = superuser.get(changelist)
    assert page.status_code == 200 and "Confirm mass loss" in page.content.decode()
    assert superuser.get(changelist + "add/").status_code == 403
    view = superuser.get(f"{changelist}{clock.pk}/change/")
    assert view.status_code == 200 and 'name="_save"' not in view.content.decode()

    done = superuser.post(
        changelist, {"action": "confirm_mass_loss", "_selected_action": [clock.pk]}, follow=True
    ).content.decode()
    assert "Mass node loss confirmed" in done
    assert not mass_loss_open() and listening.current().confirmed_by == "root-ops"
    refused = superuser.post(
        changelist, {"action": "confirm_mass_loss", "_selected_action": [clock.pk]}, follow=True
    ).content.decode()
    assert "NODE_MASS_LOSS_NOT_HELD" in refused
