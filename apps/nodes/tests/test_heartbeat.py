"""Heartbeats over real HTTP to the web application under gunicorn: everything validated at the
boundary; bad input is a 400 with a code and nothing is half-written."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apps.nodes.models import GPU, Node
from apps.nodes.tests.factories import GIB, gpu_report, heartbeat_report, make_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

PATH = "/api/v1/agent/heartbeat"


@pytest.fixture
def post(live_web):
    with httpx.Client(base_url=live_web.url, timeout=10) as client:

        def send(credential: str | None, report: Any = None, **headers: str) -> httpx.Response:
            all_headers = {"Content-Type": "application/json", **headers}
            if credential is not None:
                all_headers["Authorization"] = f"Bearer {credential}"
            body = report if isinstance(report, bytes) else json.dumps(report or heartbeat_report()).encode()
            return client.post(PATH, content=body, headers=all_headers)

        yield send


def snapshot(node: Node) -> tuple:
    node.refresh_from_db()
    gpus = list(GPU.objects.filter(node=node).order_by("index").values_list("index", "memory_used_bytes"))
    return (node.liveness, node.last_heartbeat_at, node.memory_total_bytes, node.enabled, node.name, gpus)


def assert_envelope(response: httpx.Response, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"code", "message", "correlation_id"}
    assert body["code"] == code
    assert body["correlation_id"] == response.headers["X-Correlation-ID"]
    return body


def test_a_heartbeat_brings_the_node_online_with_its_inventory(post):
    node, credential = make_node()
    response = post(credential)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "node_id": str(node.pk),
        "liveness": "online",
        "enabled": True,
        "heartbeat_interval_s": 1,  # the session web process answers 1 s (tests/fixtures.live_web)
    }
    assert response.headers["X-Correlation-ID"]
    node.refresh_from_db()
    assert node.liveness == "online" and node.last_heartbeat_at is not None
    assert node.memory_total_bytes == 64 * GIB
    assert node.agent_url == "http://10.0.0.5:8471"
    assert node.models_present == [{"name": "bge-small", "kind": "weights_directory"}]
    gpus = list(node.gpus.order_by("index"))
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_external_bytes == 4 * GIB  # used 6, of which ModelForge's 2
    assert gpus[0].memory_free_bytes == 18 * GIB
    assert node.events.filter(kind="liveness", from_liveness="pending", to_liveness="online").count() == 1


def test_a_gpu_no_longer_reported_is_dropped(post):
    node, credential = make_node()
    assert post(credential, heartbeat_report(gpus=3)).status_code == 200
    assert post(credential, heartbeat_report(gpus=1)).status_code == 200
    assert list(node.gpus.values_list("index", flat=True)) == [0]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r["gpus"][0].update(memory_used_bytes=25 * GIB), "memory_used_bytes exceeds"),
        (lambda r: r["gpus"][0].update(memory_managed_bytes=7 * GIB), "memory_managed_bytes exceeds"),
        (lambda r: r["gpus"][1].update(utilization_percent=-1), "$.gpus[1].utilization_percent"),
        (lambda r: r["gpus"][1].update(temperature_c=400), "$.gpus[1].temperature_c"),
        (lambda r: r["memory"].update(available_bytes=65 * GIB), "available_bytes exceeds"),
        (lambda r: r["shm"].update(total_bytes=-5), "$.shm.total_bytes"),
        (lambda r: r["cpu"].update(count=0), "$.cpu.count"),
        (lambda r: r.update(gpus=[gpu_report(i % 64) for i in range(65)]), "$.gpus"),
        (lambda r: r.update(gpus=[gpu_report(0), gpu_report(0)]), "reported twice"),
        (lambda r: r.update(models_present=[{"name": "x", "kind": "pickle"}]), "$.models_present[0].kind"),
        (lambda r: r.update(agent_version="v" * 200), "$.agent_version"),
        (lambda r: r.update(agent_url="ftp://x"), "agent_url"),
        # Issue 47: the same rule as enrollment's (apps/nodes/agent_url.py); these three were taken.
        (lambda r: r.update(agent_url="https://x y:80"), "agent_url: it contains a space"),
        (lambda r: r.update(agent_url="http://h"), "agent_url: it names no port"),
        (lambda r: r.update(agent_url="http://a:0"), "agent_url: the port must be 1 to 65535"),
        (lambda r: r.update(accelerator="cpu"), "a cpu node reports no GPUs"),
        (lambda r: r.update(surprise=1), "unknown field `surprise`"),
        (lambda r: r["gpus"][0].update(extra="x"), "unknown field `extra`"),
        (lambda r: r.pop("memory"), "missing required field `memory`"),
        (lambda r: r["gpus"][0].update(memory_total_bytes="lots"), "$.gpus[0].memory_total_bytes"),
    ],
)
def test_bad_telemetry_is_a_400_naming_the_field_and_nothing_is_written(post, mutate, field):
    node, credential = make_node()
    assert post(credential).status_code == 200
    before = snapshot(node)
    report = heartbeat_report()
    mutate(report)
    body = assert_envelope(post(credential, report), 400, "VALIDATION_ERROR")
    assert field in body["message"]
    assert snapshot(node) == before


def test_malformed_json_is_a_400(post):
    _, credential = make_node()
    assert_envelope(post(credential, b"{not json"), 400, "MALFORMED_REQUEST")


@pytest.mark.parametrize(
    "field", ["enabled", "name", "liveness", "id", "credential_hash", "last_heartbeat_at"]
)
def test_an_agent_cannot_set_what_it_does_not_report(post, field):
    node, credential = make_node(enabled=False)
    report = heartbeat_report()
    report[field] = {"enabled": True, "name": "hijacked", "liveness": "online"}.get(field, "x")
    body = assert_envelope(post(credential, report), 400, "VALIDATION_ERROR")
    assert f"unknown field `{field}`" in body["message"]
    node.refresh_from_db()
    assert (node.enabled, node.name, node.liveness) == (False, "node-1", "pending")


def test_a_disabled_node_reports_but_stays_disabled(post):
    node, credential = make_node(enabled=False)
    assert post(credential).json()["enabled"] is False
    node.refresh_from_db()
    assert node.liveness == "online" and node.enabled is False
    assert not node.is_assignable()


@pytest.mark.parametrize("authorization", ["Bearer mfn_wrong", "Bearer", "Basic YWI6Y2Q=", None])
def test_a_wrong_credential_is_refused(post, authorization):
    make_node()
    headers = {"Authorization": authorization} if authorization else {}
    body = assert_envelope(post(None, **headers), 401, "NODE_CREDENTIAL_INVALID")
    assert body["message"]
    assert not Node.objects.filter(liveness="online").exists()


def test_a_wrong_credential_and_the_operator_key_get_the_same_refusal(post, settings):
    make_node()
    response = post(settings.OPERATOR_API_KEY)
    assert_envelope(response, 401, "NODE_CREDENTIAL_INVALID")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_body_over_the_limit_is_413_and_a_wrong_method_405(post, live_web):
    _, credential = make_node()
    huge = json.dumps({**heartbeat_report(), "pad": "x" * 2_000_000}).encode()
    assert_envelope(post(credential, huge), 413, "PAYLOAD_TOO_LARGE")
    response = httpx.get(live_web.url + PATH)
    assert_envelope(response, 405, "METHOD_NOT_ALLOWED")
    assert response.headers["Allow"] == "POST"


def test_a_non_json_body_is_415(live_web):
    _, credential = make_node()
    response = httpx.post(
        live_web.url + PATH, content=b"a=b", headers={"Authorization": f"Bearer {credential}"}
    )
    assert_envelope(response, 415, "UNSUPPORTED_MEDIA_TYPE")


def test_the_correlation_id_is_kept(post):
    _, credential = make_node()
    response = post(credential, **{"X-Correlation-ID": "hb-corr-12345"})
    assert response.headers["X-Correlation-ID"] == "hb-corr-12345"


def test_a_cpu_node_reports_no_gpus(post):
    node, credential = make_node(accelerator="cpu")
    assert post(credential, heartbeat_report(gpus=0)).status_code == 200
    node.refresh_from_db()
    assert node.accelerator == "cpu" and not node.gpus.exists()
