"""Enrollment: single use, expiring, hashed tokens traded for a node identity; exactly one racer wins."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from apps.nodes.models import EnrollmentToken, Node, NodeEvent, digest

pytestmark = pytest.mark.django_db

ENROLL = "/api/v1/agent/enroll"


def enroll_body(token: str, name: str = "gpu-box-1") -> dict[str, str]:
    return {
        "token": token,
        "name": name,
        "accelerator": "nvidia",
        "agent_version": "0.1.0",
        "agent_url": "http://10.0.0.5:8471",
    }


def mint(operator_client, **body) -> dict:
    response = operator_client.post("/api/v1/enrollment-tokens", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_minted_token_is_shown_once_and_stored_hashed(operator_client):
    minted = mint(operator_client, note="rack 2")
    plain = minted["token"]
    assert plain.startswith("mfe_")
    stored = EnrollmentToken.objects.get(pk=minted["id"])
    assert stored.token_hash == digest(plain)
    assert plain not in str(stored.__dict__)
    listed = operator_client.get("/api/v1/enrollment-tokens").json()["results"]
    assert listed[0]["display_prefix"] == plain[:10]
    assert "token" not in listed[0]
    assert "token" not in operator_client.get(f"/api/v1/enrollment-tokens/{minted['id']}").json()


def test_minting_needs_an_operator(anonymous_client):
    assert anonymous_client.post("/api/v1/enrollment-tokens", {}, format="json").status_code == 401


def test_an_agent_trades_the_token_for_an_identity(operator_client):
    plain = mint(operator_client)["token"]
    response = APIClient().post(ENROLL, enroll_body(plain), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    node = Node.objects.get(pk=body["node_id"])
    assert node.name == "gpu-box-1"
    assert body["credential"].startswith("mfn_")
    assert node.credential_hash == digest(body["credential"])
    assert node.liveness == "pending"
    token = EnrollmentToken.objects.get()
    assert token.used_at is not None and token.node == node
    assert NodeEvent.objects.filter(node=node, kind="enrolled").exists()


def test_a_dotless_container_host_name_is_a_valid_agent_url(operator_client):
    plain = mint(operator_client)["token"]
    body = {**enroll_body(plain), "agent_url": "http://3f9c2a1b7d4e:8471"}
    assert APIClient().post(ENROLL, body, format="json").status_code == 201


def test_a_reused_token_is_refused(operator_client):
    plain = mint(operator_client)["token"]
    assert APIClient().post(ENROLL, enroll_body(plain), format="json").status_code == 201
    again = APIClient().post(ENROLL, enroll_body(plain, name="other"), format="json")
    assert again.status_code == 409
    assert again.json()["code"] == "ENROLLMENT_TOKEN_USED"
    assert "MODELFORGE_AGENT_STATE_VOLUME" in again.json()["message"]
    assert Node.objects.count() == 1


def test_an_expired_token_is_refused(operator_client):
    plain = mint(operator_client, ttl_seconds=60)["token"]
    with time_machine.travel(timezone.now() + timedelta(seconds=61)):
        response = APIClient().post(ENROLL, enroll_body(plain), format="json")
    assert response.status_code == 401
    assert response.json()["code"] == "ENROLLMENT_TOKEN_EXPIRED"
    assert not Node.objects.exists()


def test_an_unknown_token_is_refused():
    response = APIClient().post(ENROLL, enroll_body("mfe_not-a-real-token"), format="json")
    assert response.status_code == 401
    assert response.json()["code"] == "ENROLLMENT_TOKEN_UNKNOWN"


def test_a_revoked_token_is_refused(operator_client):
    minted = mint(operator_client)
    assert (
        operator_client.post(f"/api/v1/enrollment-tokens/{minted['id']}/revoke").json()["state"] == "revoked"
    )
    response = APIClient().post(ENROLL, enroll_body(minted["token"]), format="json")
    assert response.json()["code"] == "ENROLLMENT_TOKEN_REVOKED"


def test_a_taken_name_is_refused_and_the_token_stays_usable(operator_client):
    first = mint(operator_client)["token"]
    assert APIClient().post(ENROLL, enroll_body(first, name="box"), format="json").status_code == 201
    second = mint(operator_client)["token"]
    clash = APIClient().post(ENROLL, enroll_body(second, name="box"), format="json")
    assert clash.status_code == 409
    assert clash.json()["code"] == "NODE_NAME_TAKEN"
    assert APIClient().post(ENROLL, enroll_body(second, name="box-2"), format="json").status_code == 201


@pytest.mark.parametrize(
    "change",
    [
        {"name": "has spaces"},
        {"accelerator": "tpu"},
        {"agent_url": "not a url"},
        {"enabled": False},
        {"token": ""},
    ],
)
def test_bad_enrollment_input_is_a_400_and_nothing_is_used(operator_client, change):
    plain = mint(operator_client)["token"]
    body = {**enroll_body(plain), **change}
    response = APIClient().post(ENROLL, body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_ERROR"
    assert EnrollmentToken.objects.get().used_at is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_redemptions_of_one_token_have_exactly_one_winner(operator_client):
    plain = mint(operator_client)["token"]
    racers = 8
    barrier = threading.Barrier(racers)
    statuses: list[int] = []
    codes: list[str] = []

    def redeem(i: int) -> None:
        try:
            barrier.wait()
            response = APIClient().post(ENROLL, enroll_body(plain, name=f"racer-{i}"), format="json")
            statuses.append(response.status_code)
            if response.status_code != 201:
                codes.append(response.json()["code"])
        finally:
            connection.close()

    threads = [threading.Thread(target=redeem, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [201] + [409] * (racers - 1)
    assert set(codes) == {"ENROLLMENT_TOKEN_USED"}
    assert Node.objects.count() == 1
