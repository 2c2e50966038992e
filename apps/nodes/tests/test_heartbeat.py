"""Heartbeats: everything validated at the boundary; bad input is a 400 and nothing is half-written."""

from __future__ import annotations

import pytest

from apps.nodes.models import GPU, Node
from apps.nodes.tests.factories import GIB, gpu_report, heartbeat_report, make_node, send_heartbeat

pytestmark = pytest.mark.django_db


def snapshot(node: Node) -> tuple:
    node.refresh_from_db()
    gpus = list(GPU.objects.filter(node=node).order_by("index").values_list("index", "memory_used_bytes"))
    return (node.liveness, node.last_heartbeat_at, node.memory_total_bytes, node.enabled, node.name, gpus)


def test_a_heartbeat_brings_the_node_online_with_its_inventory():
    node, credential = make_node()
    response = send_heartbeat(credential)
    assert response.status_code == 200, response.content
    assert response.json()["liveness"] == "online"
    node.refresh_from_db()
    assert node.liveness == "online"
    assert node.last_heartbeat_at is not None
    assert node.memory_total_bytes == 64 * GIB
    assert node.models_present == [{"name": "bge-small", "kind": "weights_directory"}]
    gpus = list(node.gpus.order_by("index"))
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_external_bytes == 4 * GIB  # used 6, of which ModelForge's 2
    assert gpus[0].memory_free_bytes == 18 * GIB
    assert node.events.filter(kind="liveness", from_liveness="pending", to_liveness="online").count() == 1


def test_a_gpu_no_longer_reported_is_dropped():
    node, credential = make_node()
    send_heartbeat(credential, heartbeat_report(gpus=3))
    send_heartbeat(credential, heartbeat_report(gpus=1))
    assert list(node.gpus.values_list("index", flat=True)) == [0]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r["gpus"][0].update(memory_used_bytes=25 * GIB), "gpus"),
        (lambda r: r["gpus"][0].update(memory_managed_bytes=7 * GIB), "gpus"),
        (lambda r: r["gpus"][1].update(utilization_percent=-1), "gpus"),
        (lambda r: r["gpus"][1].update(temperature_c=400), "gpus"),
        (lambda r: r["memory"].update(available_bytes=65 * GIB), "memory"),
        (lambda r: r["shm"].update(total_bytes=-5), "shm"),
        (lambda r: r["cpu"].update(count=0), "cpu"),
        (lambda r: r.update(gpus=[gpu_report(i) for i in range(65)]), "gpus"),
        (lambda r: r.update(gpus=[gpu_report(0), gpu_report(0)]), "gpus"),
        (lambda r: r.update(models_present=[{"name": "x", "kind": "pickle"}]), "models_present"),
        (lambda r: r.update(agent_version="v" * 200), "agent_version"),
        (lambda r: r.update(accelerator="cpu"), "gpus"),
        (lambda r: r.update(surprise=1), "surprise"),
        (lambda r: r["gpus"][0].update(extra="x"), "gpus"),
        (lambda r: r.pop("memory"), "memory"),
    ],
)
def test_bad_telemetry_is_a_400_naming_the_field_and_nothing_is_written(mutate, field):
    node, credential = make_node()
    send_heartbeat(credential)
    before = snapshot(node)
    report = heartbeat_report()
    mutate(report)
    response = send_heartbeat(credential, report)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "VALIDATION_ERROR"
    assert field in body["message"]
    assert snapshot(node) == before


@pytest.mark.parametrize(
    "field", ["enabled", "name", "liveness", "id", "credential_hash", "last_heartbeat_at"]
)
def test_an_agent_cannot_set_what_it_does_not_report(field):
    node, credential = make_node(enabled=False)
    report = heartbeat_report()
    report[field] = {"enabled": True, "name": "hijacked", "liveness": "online"}.get(field, "x")
    response = send_heartbeat(credential, report)
    assert response.status_code == 400
    assert f"{field}: Unknown field." in response.json()["message"]
    node.refresh_from_db()
    assert (node.enabled, node.name, node.liveness) == (False, "node-1", "pending")


def test_a_disabled_node_reports_but_stays_disabled():
    node, credential = make_node(enabled=False)
    response = send_heartbeat(credential)
    assert response.json()["enabled"] is False
    node.refresh_from_db()
    assert node.liveness == "online" and node.enabled is False
    assert not node.is_assignable()


@pytest.mark.parametrize("header", ["Bearer mfn_wrong", "Bearer ", "Basic abc", None])
def test_a_wrong_credential_is_refused(header, client):
    make_node()
    kwargs = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    response = client.post(
        "/api/v1/agent/heartbeat", heartbeat_report(), content_type="application/json", **kwargs
    )
    assert response.status_code == 401
    assert response.json()["code"] == "NODE_CREDENTIAL_INVALID"
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert not Node.objects.filter(liveness="online").exists()


def test_the_operator_key_is_not_a_node_credential(operator_client):
    response = operator_client.post("/api/v1/agent/heartbeat", heartbeat_report(), format="json")
    assert response.status_code == 401
    assert response.json()["code"] == "NODE_CREDENTIAL_INVALID"


def test_a_cpu_node_reports_no_gpus():
    node, credential = make_node(accelerator="cpu")
    assert send_heartbeat(credential, heartbeat_report(gpus=0)).status_code == 200
    node.refresh_from_db()
    assert node.accelerator == "cpu" and not node.gpus.exists()
