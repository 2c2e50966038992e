"""The lean ASGI endpoints live outside Django's resolver (tests/test_surfaces.py cannot see them): each
refuses a call without its own credential, and refuses the operator key too, as the envelope."""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from apps.nodes.tests.factories import heartbeat_report

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

# (method, path, body, code, realm): one row per lean endpoint and route shape. The bodies are valid, so
# that the refusal is the credential's (the gateway and the heartbeat judge a malformed body first).
LEAN_ENDPOINTS = [
    ("POST", "/api/v1/agent/heartbeat", heartbeat_report(), "NODE_CREDENTIAL_INVALID", None),
    (
        "GET",
        "/api/v1/agent/artifacts/1/files/w.safetensors",
        None,
        "NODE_CREDENTIAL_INVALID",
        "modelforge-agent",
    ),
    (
        "POST",
        "/v1/embeddings",
        {"model": "rag.embedding@1", "input": "x"},
        "CAPABILITY_NOT_AUTHORIZED",
        "modelforge-gateway",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "chat@1", "messages": [{"role": "user", "content": "hi"}]},
        "CAPABILITY_NOT_AUTHORIZED",
        "modelforge-gateway",
    ),
]


@pytest.mark.parametrize("credential", [None, "operator-key"], ids=["no credential", "the operator key"])
@pytest.mark.parametrize(
    ("method", "path", "body", "code", "realm"), LEAN_ENDPOINTS, ids=[r[1] for r in LEAN_ENDPOINTS]
)
def test_a_lean_endpoint_refuses_without_its_own_credential(
    live_web, credential, method, path, body, code, realm
):
    headers = {"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"} if credential else {}
    response = httpx.request(method, live_web.url + path, json=body, headers=headers, timeout=10)
    assert response.status_code == 401, response.text
    envelope = response.json()
    assert set(envelope) == {"code", "message", "correlation_id"}
    assert envelope["code"] == code
    assert envelope["correlation_id"] == response.headers["x-correlation-id"]
    assert response.headers["www-authenticate"].startswith("Bearer")
    if realm:
        assert response.headers["www-authenticate"] == f'Bearer realm="{realm}"'
