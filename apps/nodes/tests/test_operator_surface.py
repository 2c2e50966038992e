"""Nodes in the API, the dashboard and the admin: list, filter, detail, enable/disable."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.nodes.tests.factories import beat, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    gpu, c1 = make_node(name="gpu-a")
    cpu, c2 = make_node(name="cpu-b", accelerator="cpu")
    idle, _ = make_node(name="idle-c", enabled=False)
    beat(c1)
    from apps.nodes.tests.factories import heartbeat_report

    beat(c2, heartbeat_report(gpus=0))
    return gpu, cpu, idle


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("", ["cpu-b", "gpu-a", "idle-c"]),
        ("?liveness=online", ["cpu-b", "gpu-a"]),
        ("?liveness=pending", ["idle-c"]),
        ("?enabled=false", ["idle-c"]),
        ("?accelerator=cpu", ["cpu-b"]),
        ("?name=gpu", ["gpu-a"]),
    ],
)
def test_the_node_list_filters(operator_client, fleet, query, names):
    response = operator_client.get("/api/v1/nodes" + query)
    assert response.status_code == 200
    assert [n["name"] for n in response.json()["results"]] == names


def test_a_bad_filter_value_is_a_400_envelope(operator_client, fleet):
    response = operator_client.get("/api/v1/nodes?liveness=asleep")
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_ERROR"
    assert "liveness" in response.json()["message"]


def test_node_detail_shows_gpus_events_and_assignability(operator_client, fleet):
    gpu, _, _ = fleet
    body = operator_client.get(f"/api/v1/nodes/{gpu.pk}").json()
    assert body["assignable"] is True
    assert body["gpus"][0]["memory_external_bytes"] == 4 * 2**30
    assert body["recent_events"][0]["to_liveness"] == "online"
    assert "credential_hash" not in body


def test_enable_and_disable_leave_events_and_change_assignability(operator_client, fleet):
    gpu, _, _ = fleet
    disabled = operator_client.post(f"/api/v1/nodes/{gpu.pk}/disable").json()
    assert disabled["enabled"] is False and disabled["assignable"] is False
    assert disabled["recent_events"][0]["kind"] == "disabled"
    assert "operator-api-key" in disabled["recent_events"][0]["detail"]
    assert operator_client.post(f"/api/v1/nodes/{gpu.pk}/enable").json()["assignable"] is True


def test_nodes_cannot_be_created_or_edited_through_the_api(operator_client, fleet):
    gpu, _, _ = fleet
    assert operator_client.post("/api/v1/nodes", {"name": "x"}, format="json").status_code == 405
    assert (
        operator_client.patch(f"/api/v1/nodes/{gpu.pk}", {"enabled": False}, format="json").status_code == 405
    )


def test_dashboard_pages_render(client, fleet):
    gpu, _, idle = fleet
    client.force_login(User.objects.create_user("ops", is_staff=True))
    listing = client.get("/nodes/?liveness=online")
    assert listing.status_code == 200
    assert b"gpu-a" in listing.content and b"idle-c" not in listing.content
    detail = client.get(f"/nodes/{gpu.pk}/")
    assert b"external pressure" in detail.content
    assert b'class="seg managed"' in detail.content
    minted = client.post("/nodes/enrollment-tokens/", {"note": "for rack 3"}, follow=True)
    assert b"shown once" in minted.content and b"mfe_" in minted.content
    assert b'id="minted-token"' not in client.get("/nodes/enrollment-tokens/").content  # once only
    client.post(f"/nodes/{idle.pk}/enable")
    idle.refresh_from_db()
    assert idle.enabled


def test_admin_pages_render(client, fleet):
    gpu, _, _ = fleet
    client.force_login(User.objects.create_superuser("root-ops", email="", password="x-long-password-1"))
    assert client.get("/admin/nodes/node/").status_code == 200
    assert client.get(f"/admin/nodes/node/{gpu.pk}/change/").status_code == 200
    minted = client.post("/admin/nodes/enrollmenttoken/mint/", follow=True)
    assert b"shown once" in minted.content
    assert client.get("/admin/alerts/alert/").status_code == 200


def test_a_fleet_event_is_in_each_moved_nodes_history_in_the_api_and_on_its_page(
    operator_client, fleet, settings
):
    """A transition of many nodes at once is one event row (apps/nodes/liveness.py): every node it moved
    shows it, with how many moved; a node it did not move does not."""
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from apps.nodes.liveness import sweep
    from apps.nodes.models import Node

    gpu, cpu, idle = fleet
    Node.objects.filter(pk__in=[gpu.pk, cpu.pk]).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    settings.LIVENESS_MASS_LOSS_MIN_NODES = 2
    assert sorted(name for _, name in sweep().stale) == ["cpu-b", "gpu-a"]
    for node in (gpu, cpu):
        latest = operator_client.get(f"/api/v1/nodes/{node.pk}").json()["recent_events"][0]
        assert (latest["from_liveness"], latest["to_liveness"], latest["fleet_size"]) == (
            "online",
            "stale",
            2,
        )
        assert latest["detail"].endswith("(2 nodes at once)")
    older = operator_client.get(f"/api/v1/nodes/{gpu.pk}").json()["recent_events"][1]
    assert (older["to_liveness"], older["fleet_size"]) == ("online", None)  # its own event, as before
    assert all(
        e["to_liveness"] != "stale"
        for e in operator_client.get(f"/api/v1/nodes/{idle.pk}").json()["recent_events"]
    )
    browser = Client()
    browser.force_login(User.objects.create_superuser("fleet-op", password="x"))
    page = browser.get(f"/nodes/{cpu.pk}/").content.decode()
    assert "online → stale" in page and "(2 nodes at once)" in page
