"""Operator authentication for /api/v1/ and the unauthenticated probes."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from modelforge import health, probes

pytestmark = pytest.mark.django_db


def test_the_operator_key_opens_the_api(operator_client):
    response = operator_client.get("/api/v1/system/status")
    assert response.status_code == 200
    assert response.json()["database"]["ok"] is True


def test_a_wrong_operator_key_is_refused():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer not-the-key-at-all-not-the-key-at-all")
    response = client.get("/api/v1/system/status")
    assert response.status_code == 401
    assert response.json()["code"] == "NOT_AUTHENTICATED"
    assert response.json()["message"] == "The operator API key is not valid."


def test_an_empty_bearer_is_refused():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer ")
    assert client.get("/api/v1/system/status").status_code == 401


def test_a_staff_session_opens_the_api():
    user = User.objects.create_user("alice", password="a-long-password-1", is_staff=True)
    client = APIClient()
    client.force_login(user)
    assert client.get("/api/v1/system/status").status_code == 200


def test_a_non_staff_session_is_forbidden():
    user = User.objects.create_user("bob", password="a-long-password-1", is_staff=False)
    client = APIClient()
    client.force_login(user)
    response = client.get("/api/v1/system/status")
    assert response.status_code == 403
    assert response.json()["code"] == "PERMISSION_DENIED"


def test_a_session_must_send_the_csrf_token_for_writes():
    user = User.objects.create_user("carol", password="a-long-password-1", is_staff=True)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post("/api/v1/system/worker-probe")
    assert response.status_code == 403
    assert set(response.json()) == {"code", "message", "correlation_id"}


def test_healthz_needs_no_credentials(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_reports_database_and_broker(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert body["database"].startswith("PostgreSQL 16")
    assert body["broker"].startswith("Redis")


def test_readyz_is_503_naming_the_broker_when_it_is_unreachable(client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    probes.redis_client.cache_clear()
    health.forget_readiness()  # a success of less than a second ago would still be the answer
    try:
        response = client.get("/readyz")
    finally:
        probes.redis_client.cache_clear()
        health.forget_readiness()
    assert response.status_code == 503
    body = json.loads(response.content)
    assert set(body) == {"code", "message", "correlation_id"}
    assert body["code"] == "BROKER_UNREACHABLE"
    assert "broker unreachable" in body["message"]
    assert response["Retry-After"] == "5"


def test_the_schema_declares_the_error_envelope_on_every_operation(operator_client):
    response = operator_client.get("/api/v1/schema/?format=json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    envelope = schema["components"]["schemas"]["Error"]
    assert envelope["required"] == ["code", "message", "correlation_id"]
    assert envelope["additionalProperties"] is False
    operations = [op for item in schema["paths"].values() for op in item.values() if isinstance(op, dict)]
    assert len(operations) >= 2
    for operation in operations:
        for code in ("400", "401", "403", "404", "405", "409", "413", "429", "503"):
            ref = operation["responses"][code]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/Error"


def test_the_schema_needs_operator_credentials(anonymous_client):
    assert anonymous_client.get("/api/v1/schema/").status_code == 401


def test_metrics_need_an_operator_and_expose_the_platform_state(operator_client, anonymous_client):
    assert anonymous_client.get("/metrics").status_code == 401
    response = operator_client.get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    assert "modelforge_lb_redis_reachable 1.0" in text
    assert "# TYPE modelforge_nodes gauge" in text and "modelforge_alerts_open" in text


def test_metrics_say_when_redis_is_unreachable(operator_client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    assert "modelforge_lb_redis_reachable 0.0" in operator_client.get("/metrics").content.decode()
