"""Invalid node credentials on the heartbeat, over real HTTP from real loopback addresses: counted per
address and answered ``429 TOO_MANY_AUTH_FAILURES`` past the limit, while a valid credential from the same
address is still heard (nodes behind one NAT address must not go offline for one broken agent)."""

from __future__ import annotations

import json

import httpx
import pytest
from django.conf import settings

from apps.nodes.models import Node
from apps.nodes.tests.factories import heartbeat_report, make_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

PATH = "/api/v1/agent/heartbeat"


def client_from(live_web, address: str) -> httpx.Client:
    """Connects from ``address`` (any 127.0.0.0/8 address is this machine's loopback)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=live_web.url, timeout=10, transport=transport)


def beat(client: httpx.Client, credential: str) -> httpx.Response:
    return client.post(
        PATH,
        content=json.dumps(heartbeat_report()).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {credential}"},
    )


def test_invalid_node_credentials_reach_the_limit_and_a_valid_one_is_still_heard(live_web):
    node, credential = make_node()
    limit = settings.API_AUTH_FAILURE_LIMIT  # the web process runs with the default
    with client_from(live_web, "127.0.0.2") as nat, client_from(live_web, "127.0.0.3") as other:
        for i in range(limit - 1):
            response = beat(nat, f"mfn_guess-{i}")
            assert response.status_code == 401, response.text
            assert response.json()["code"] == "NODE_CREDENTIAL_INVALID"
        response = beat(nat, "mfn_guess-last")
        assert response.status_code == 429, response.text
        body = response.json()
        assert set(body) == {"code", "message", "correlation_id"}
        assert body["code"] == "TOO_MANY_AUTH_FAILURES"
        assert int(response.headers["Retry-After"]) == settings.API_AUTH_FAILURE_WINDOW
        assert "127.0.0.2" in body["message"] and "still heard" in body["message"]

        assert beat(nat, credential).status_code == 200
        node.refresh_from_db()
        assert node.liveness == "online"

        elsewhere = beat(other, "mfn_guess-elsewhere")
        assert elsewhere.status_code == 401
        assert elsewhere.json()["code"] == "NODE_CREDENTIAL_INVALID"
    assert Node.objects.count() == 1
