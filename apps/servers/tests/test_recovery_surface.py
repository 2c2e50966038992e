"""A failed server in the API, the dashboard and the admin: restart, re-place, delete (with its tombstone),
the restart policy, and what uses the server; refusals by code, never a 500."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.alerts.models import Alert
from apps.clusters.models import Capability, Cluster, ClusterMember, RoutingTier
from apps.servers import recovery, services
from apps.servers.models import ModelServer, ServerTombstone
from apps.servers.scheduler import Request, place
from apps.servers.tests.factories import cpu_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


@pytest.fixture
def admin_client_(client):
    client.force_login(User.objects.create_superuser("root-ops", email="", password="x-long-password-1"))
    return client


def placed(name: str = "echo", node: str | None = None) -> ModelServer:
    return place(Request(name=name, profile="test-echo", model="m", node=node))


def failed(name: str = "echo", code: str = "PROCESS_LOST") -> ModelServer:
    server = placed(name)
    server.fail(code, "the process exited with status 137")
    recovery.raise_failed_alerts()
    return server


def assert_envelope(response, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "correlation_id"}
    assert body["code"] == code
    return str(body["message"])


# --- API ------------------------------------------------------------------------------------------


def test_restart_puts_a_failed_server_back_on_its_own_node(operator_client):
    node = cpu_node("cpu-a", available_gib=8)
    server = failed()
    response = operator_client.post(f"/api/v1/servers/{server.pk}/restart")
    assert response.status_code == 202
    body = response.json()
    assert (body["state"], body["node_name"], body["failure_code"]) == ("starting", "cpu-a", "")
    assert "restart requested by operator-api-key" in body["events"][1]["detail"]
    server.refresh_from_db()
    assert (server.state, server.node_id) == ("starting", node.pk)


def test_restart_of_a_running_server_is_invalid_server_state(operator_client):
    cpu_node("cpu-a", available_gib=8)
    server = placed()
    message = assert_envelope(
        operator_client.post(f"/api/v1/servers/{server.pk}/restart"), 409, "INVALID_SERVER_STATE"
    )
    assert "only a failed server can be restarted" in message
    server.refresh_from_db()
    assert server.state == "starting"


def test_replace_moves_a_failed_server_off_a_node_that_is_gone(operator_client):
    old = cpu_node("cpu-a", available_gib=8)
    server = failed()
    old.set_enabled(False, by="test")
    cpu_node("cpu-b", available_gib=8)
    response = operator_client.post(f"/api/v1/servers/{server.pk}/replace")
    assert response.status_code == 202
    assert (response.json()["id"], response.json()["node_name"]) == (str(server.pk), "cpu-b")


def test_replace_with_no_eligible_node_is_503_and_the_server_stays_failed(operator_client):
    node = cpu_node("cpu-a", available_gib=8)
    server = failed()
    node.set_enabled(False, by="test")
    assert_envelope(operator_client.post(f"/api/v1/servers/{server.pk}/replace"), 503, "NO_ELIGIBLE_NODE")
    server.refresh_from_db()
    assert (server.state, server.failure_code) == ("failed", "PROCESS_LOST")


def test_delete_of_a_running_server_is_refused(operator_client):
    cpu_node("cpu-a", available_gib=8)
    server = placed()
    message = assert_envelope(
        operator_client.delete(f"/api/v1/servers/{server.pk}"), 409, "INVALID_SERVER_STATE"
    )
    assert "stop it before deleting it" in message
    assert ModelServer.objects.filter(pk=server.pk).exists()


def test_delete_of_a_failed_server_leaves_a_tombstone_and_clears_its_alert(operator_client):
    node = cpu_node("cpu-a", available_gib=8)
    server = failed()
    assert Alert.objects.open().filter(code="SERVER_FAILED", subject_id=str(server.pk)).exists()
    response = operator_client.delete(f"/api/v1/servers/{server.pk}")
    assert response.status_code == 204
    assert not ModelServer.objects.filter(pk=server.pk).exists()
    tombstone = ServerTombstone.objects.get(server_id=server.pk)
    assert (tombstone.name, tombstone.node_id, tombstone.deleted_by) == ("echo", node.pk, "operator-api-key")
    assert not Alert.objects.open().filter(code="SERVER_FAILED").exists()
    assert_envelope(operator_client.delete(f"/api/v1/servers/{server.pk}"), 404, "NOT_FOUND")


def test_delete_of_a_stopped_server_leaves_no_tombstone(operator_client):
    cpu_node("cpu-a", available_gib=8)
    server = placed()
    server.transition("stopping")
    server.transition("stopped")
    assert operator_client.delete(f"/api/v1/servers/{server.pk}").status_code == 204
    assert not ServerTombstone.objects.exists()


def test_the_restart_policy_is_changed_with_patch_and_nothing_else_is(operator_client):
    cpu_node("cpu-a", available_gib=8)
    server = failed()
    url = f"/api/v1/servers/{server.pk}"
    assert operator_client.get(url).json()["next_restart_at"] is not None
    changed = operator_client.patch(url, {"restart_policy": "never"}, format="json")
    assert changed.status_code == 200
    assert (changed.json()["restart_policy"], changed.json()["next_restart_at"]) == ("never", None)
    server.refresh_from_db()
    assert server.restart_policy == "never"

    message = assert_envelope(
        operator_client.patch(url, {"restart_policy": "always"}, format="json"), 400, "VALIDATION_ERROR"
    )
    assert "restart_policy" in message
    message = assert_envelope(
        operator_client.patch(url, {"restart_policy": "on-failure", "name": "other"}, format="json"),
        400,
        "VALIDATION_ERROR",
    )
    assert "name: Unknown field." in message
    assert_envelope(operator_client.patch(url, {}, format="json"), 400, "VALIDATION_ERROR")
    assert_envelope(
        operator_client.put(url, {"restart_policy": "never"}, format="json"), 405, "METHOD_NOT_ALLOWED"
    )
    server.refresh_from_db()
    assert (server.name, server.restart_policy) == ("echo", "never")


def test_the_restart_policy_is_accepted_when_placing(operator_client):
    cpu_node("cpu-a", available_gib=8)
    created = operator_client.post(
        "/api/v1/servers",
        {"name": "echo", "profile": "test-echo", "model": "m", "restart_policy": "never"},
        format="json",
    )
    assert created.status_code == 201
    assert created.json()["restart_policy"] == "never"
    assert ModelServer.objects.get(name="echo").restart_policy == "never"
    default = operator_client.post(
        "/api/v1/servers", {"name": "echo-2", "profile": "test-echo", "model": "m"}, format="json"
    )
    assert default.json()["restart_policy"] == "on-failure"
    assert_envelope(
        operator_client.post(
            "/api/v1/servers",
            {"name": "echo-3", "profile": "test-echo", "model": "m", "restart_policy": "sometimes"},
            format="json",
        ),
        400,
        "VALIDATION_ERROR",
    )
    assert not ModelServer.objects.filter(name="echo-3").exists()


def test_the_list_shows_the_restart_policy_attempts_and_next_restart(operator_client, settings):
    cpu_node("cpu-a", available_gib=8)
    server = failed()
    row = operator_client.get("/api/v1/servers").json()["results"][0]
    assert (row["restart_policy"], row["restart_attempts"]) == ("on-failure", 0)
    assert server.stopped_at is not None
    due = server.stopped_at + timedelta(seconds=settings.SERVER_RESTART_BACKOFF)
    assert datetime.fromisoformat(row["next_restart_at"].replace("Z", "+00:00")) == due
    assert "used_by" not in row  # the detail's, not every row's


def test_used_by_names_the_cluster_member_and_every_capability_route(operator_client):
    cpu_node("cpu-a", available_gib=8)
    server = failed()
    cluster = Cluster.objects.create(name="embed")
    ClusterMember.objects.create(cluster=cluster, name="slot-a", server=server)
    direct = Capability.objects.create(name="rag.rerank@1")
    through = Capability.objects.create(name="rag.embedding@1")
    RoutingTier.objects.create(capability=direct, server=server, tier=1)
    RoutingTier.objects.create(capability=through, cluster=cluster, tier=0)
    RoutingTier.objects.create(capability=through, cluster=Cluster.objects.create(name="other"), tier=1)

    used = operator_client.get(f"/api/v1/servers/{server.pk}").json()["used_by"]
    assert used["clusters"] == [{"id": cluster.pk, "name": "embed", "member": "slot-a"}]
    assert sorted(used["capabilities"], key=lambda c: c["name"]) == [
        {"id": through.pk, "name": "rag.embedding@1", "tier": 0, "via": "cluster", "cluster": "embed"},
        {"id": direct.pk, "name": "rag.rerank@1", "tier": 1, "via": "server", "cluster": None},
    ]
    lonely = placed("lonely")
    assert operator_client.get(f"/api/v1/servers/{lonely.pk}").json()["used_by"] == {
        "clusters": [],
        "capabilities": [],
    }


def test_the_schema_describes_the_new_operations(operator_client):
    paths = operator_client.get("/api/v1/schema/?format=json").json()["paths"]
    assert {"post"} <= set(paths["/api/v1/servers/{id}/restart"])
    assert {"post"} <= set(paths["/api/v1/servers/{id}/replace"])
    assert {"get", "patch", "delete"} <= set(paths["/api/v1/servers/{id}"])
    assert "put" not in paths["/api/v1/servers/{id}"]


# --- Dashboard ------------------------------------------------------------------------------------


def test_a_failed_servers_page_offers_recovery_and_says_what_uses_it(staff):
    cpu_node("cpu-a", available_gib=8)
    server = failed()
    cluster = Cluster.objects.create(name="embed")
    ClusterMember.objects.create(cluster=cluster, name="slot-a", server=server)
    RoutingTier.objects.create(capability=Capability.objects.create(name="rag.rerank@1"), server=server)
    body = staff.get(f"/servers/{server.pk}/").content.decode()
    assert "PROCESS_LOST" in body and "the process exited with status 137" in body
    for action in ("restart", "replace", "delete", "restart-policy"):
        assert f'action="/servers/{server.pk}/{action}"' in body
    assert ">Restart</button>" in body and ">Re-place</button>" in body and ">Delete</button>" in body
    assert 'id="recovery"' in body and "Automatic restarts: 0 of" in body
    assert "Next automatic restart:" in body
    assert 'id="used-by"' in body
    assert f'href="/clusters/{cluster.pk}/">embed</a>, member slot-a' in body
    assert "<code>rag.rerank@1</code></a> tier 0, bound directly" in body


def test_a_stopped_server_may_only_be_deleted_and_a_running_one_only_stopped(staff):
    cpu_node("cpu-a", available_gib=8)
    running = placed("up")
    stopped = placed("down")
    stopped.transition("stopping")
    stopped.transition("stopped")
    body = staff.get(f"/servers/{stopped.pk}/").content.decode()
    assert ">Delete</button>" in body and ">Restart</button>" not in body and ">Re-place</button>" not in body
    body = staff.get(f"/servers/{running.pk}/").content.decode()
    assert ">Stop</button>" in body and ">Delete</button>" not in body and ">Restart</button>" not in body
    assert "Nothing: no cluster or capability uses this server." in body


def test_restart_and_replace_from_the_dashboard_redirect_with_a_message(staff):
    node = cpu_node("cpu-a", available_gib=8)
    server = failed()
    response = staff.post(f"/servers/{server.pk}/restart")
    assert response.status_code == 302 and response["Location"] == f"/servers/{server.pk}/"
    page = staff.get(response["Location"]).content.decode()
    assert "echo placed again on cpu-a; starting." in page
    server.refresh_from_db()
    assert server.state == "starting"

    refused = staff.post(f"/servers/{server.pk}/restart", follow=True)
    assert refused.status_code == 200
    assert "INVALID_SERVER_STATE: Server echo is starting" in refused.content.decode()

    server.fail("PROCESS_LOST", "gone again")
    node.set_enabled(False, by="test")
    refused = staff.post(f"/servers/{server.pk}/replace", follow=True)
    assert refused.status_code == 200 and "NO_ELIGIBLE_NODE: " in refused.content.decode()
    cpu_node("cpu-b", available_gib=8)
    moved = staff.post(f"/servers/{server.pk}/replace", follow=True).content.decode()
    assert "echo placed again on cpu-b; starting." in moved


def test_delete_from_the_dashboard_goes_to_the_list_and_refuses_a_live_server(staff):
    cpu_node("cpu-a", available_gib=8)
    live = placed("live")
    refused = staff.post(f"/servers/{live.pk}/delete", follow=True)
    assert "INVALID_SERVER_STATE: Server live is starting; stop it before deleting it." in (
        refused.content.decode()
    )
    server = failed()
    response = staff.post(f"/servers/{server.pk}/delete")
    assert response.status_code == 302 and response["Location"] == "/servers/"
    assert "echo deleted." in staff.get("/servers/").content.decode()
    assert ServerTombstone.objects.get(server_id=server.pk).deleted_by == "ops"
    assert staff.get(f"/servers/{server.pk}/delete").status_code == 405


def test_the_restart_policy_form_changes_it_or_names_the_bad_value(staff):
    cpu_node("cpu-a", available_gib=8)
    server = failed()
    page = staff.post(f"/servers/{server.pk}/restart-policy", {"restart_policy": "never"}, follow=True)
    body = page.content.decode()
    assert "echo: restart policy never." in body
    assert "No automatic restart is planned" in body
    server.refresh_from_db()
    assert server.restart_policy == "never"
    page = staff.post(f"/servers/{server.pk}/restart-policy", {"restart_policy": "often"}, follow=True)
    assert page.status_code == 200 and "VALIDATION_ERROR: restart_policy:" in page.content.decode()


def test_placing_from_the_dashboard_takes_a_restart_policy(staff):
    cpu_node("cpu-a", available_gib=8)
    form = staff.get("/servers/new/").content.decode()
    assert 'name="restart_policy"' in form
    staff.post(
        "/servers/new/", {"name": "echo", "profile": "test-echo", "model": "m", "restart_policy": "never"}
    )
    assert ModelServer.objects.get(name="echo").restart_policy == "never"


def test_the_node_page_lists_its_servers(staff):
    node = cpu_node("cpu-a", available_gib=8)
    server = failed("broken")
    ModelServer.objects.filter(pk=placed("fine").pk).update(port=8601)
    body = staff.get(f"/nodes/{node.pk}/").content.decode()
    assert 'id="servers"' in body
    assert f'<a href="/servers/{server.pk}/">broken</a>' in body and "<code>PROCESS_LOST</code>" in body
    assert ">fine</a>" in body and "<td>8601</td>" in body
    empty = cpu_node("cpu-b")
    assert "No model server is placed on cpu-b." in staff.get(f"/nodes/{empty.pk}/").content.decode()


# --- Admin ----------------------------------------------------------------------------------------


def test_admin_actions_recover_each_server_and_name_each_refusal(admin_client_):
    cpu_node("cpu-a", available_gib=8)
    broken = failed("broken")
    live = placed("live")
    changelist = "/admin/servers/modelserver/"
    page = admin_client_.get(changelist).content.decode()
    assert "Delete (with tombstone)" in page and "Re-place" in page and "delete_selected" not in page

    done = admin_client_.post(
        changelist, {"action": "restart_servers", "_selected_action": [broken.pk, live.pk]}, follow=True
    ).content.decode()
    assert "Restart: broken on cpu-a; starting." in done
    assert "Could not restart live: INVALID_SERVER_STATE: Server live is starting" in done
    broken.refresh_from_db()
    assert broken.state == "starting"

    broken.fail("PROCESS_LOST", "again")
    done = admin_client_.post(
        changelist, {"action": "replace_servers", "_selected_action": [broken.pk]}, follow=True
    ).content.decode()
    assert "Re-place: broken on cpu-a; starting." in done

    broken.refresh_from_db()
    broken.fail("PROCESS_LOST", "and again")
    done = admin_client_.post(
        changelist, {"action": "delete_servers", "_selected_action": [broken.pk, live.pk]}, follow=True
    ).content.decode()
    assert "Delete: broken." in done and "Could not delete live: INVALID_SERVER_STATE" in done
    assert ServerTombstone.objects.filter(server_id=broken.pk, deleted_by="root-ops").exists()
    assert ModelServer.objects.filter(pk=live.pk).exists()


def test_admin_delete_of_one_failed_server_leaves_its_tombstone(admin_client_):
    cpu_node("cpu-a", available_gib=8)
    server = failed()
    response = admin_client_.post(f"/admin/servers/modelserver/{server.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert ServerTombstone.objects.filter(server_id=server.pk).exists()


def test_tombstones_are_read_only_in_the_admin(admin_client_):
    cpu_node("cpu-a", available_gib=8)
    server = failed()
    pk = server.pk  # a deleted instance forgets its primary key
    services.delete(server, by="ops")
    listing = admin_client_.get("/admin/servers/servertombstone/")
    assert listing.status_code == 200 and "echo" in listing.content.decode()
    assert admin_client_.get("/admin/servers/servertombstone/add/").status_code == 403
    view = admin_client_.get(f"/admin/servers/servertombstone/{pk}/change/")
    assert view.status_code == 200 and 'name="_save"' not in view.content.decode()
    assert admin_client_.get(f"/admin/servers/servertombstone/{pk}/delete/").status_code == 403


# --- Stop, on every surface (apps.servers.services.stop) -------------------------------------------


def test_stop_is_one_rule_the_api_the_dashboard_and_the_admin_apply_alike(operator_client, admin_client_):
    staff = Client()
    staff.force_login(User.objects.create_user("ops", is_staff=True))
    cpu_node("cpu-a", available_gib=8)
    broken, api_live, page_live, admin_live = failed("broken"), placed("a"), placed("b"), placed("c")

    message = assert_envelope(
        operator_client.post(f"/api/v1/servers/{broken.pk}/stop"), 409, "INVALID_SERVER_STATE"
    )
    assert "Server broken is failed; it cannot become stopping." in message
    assert operator_client.post(f"/api/v1/servers/{api_live.pk}/stop").json()["state"] == "stopping"

    page = staff.post(f"/servers/{broken.pk}/stop", follow=True).content.decode()
    assert "INVALID_SERVER_STATE: Server broken is failed; it cannot become stopping." in page
    assert "Stopping b." in staff.post(f"/servers/{page_live.pk}/stop", follow=True).content.decode()

    # The admin's bulk action stops what may be stopped and leaves the rest as it is.
    done = admin_client_.post(
        "/admin/servers/modelserver/",
        {"action": "stop_servers", "_selected_action": [broken.pk, admin_live.pk]},
        follow=True,
    ).content.decode()
    assert "Stopping 1 server(s)." in done
    states = dict(ModelServer.objects.values_list("name", "state"))
    assert states == {"broken": "failed", "a": "stopping", "b": "stopping", "c": "stopping"}
    by = dict(ModelServer.objects.filter(events__to_state="stopping").values_list("name", "events__detail"))
    assert by == {
        "a": "stop requested by operator-api-key",
        "b": "stop requested by ops",
        "c": "stop requested by root-ops",
    }


def test_each_automatic_restart_the_scheduler_refuses_counts_until_they_are_exhausted(settings):
    # A server that ran for an hour, then failed: its first refused attempt moved ``stopped_at`` to the
    # attempt, so the run seemed 10 minutes long at the next sweep and the count went back to 0: six
    # refusals left ``restart_attempts`` at 1 and the policy never gave up (issue 48).
    settings.SERVER_RESTART_MAX_ATTEMPTS = 5
    node = cpu_node("cpu-a", available_gib=8)
    server = failed()
    assert server.stopped_at is not None
    now = server.stopped_at
    ModelServer.objects.filter(pk=server.pk).update(running_at=now - timedelta(hours=1))
    node.set_enabled(False, by="test")  # every placement refused: NO_ELIGIBLE_NODE
    for _ in range(6):
        now += timedelta(seconds=settings.SERVER_RESTART_BACKOFF_MAX + 1)
        recovery.recover(now)
    server.refresh_from_db()
    assert (server.state, server.restart_attempts) == ("failed", 5)
    assert "restart refused: NO_ELIGIBLE_NODE" in server.failure_message
    assert recovery.next_restart_at(server) is None
    assert "Automatic restarts are exhausted (5)" in Alert.objects.get(subject_id=str(server.pk)).message
