"""Repeated API authentication failures from one address: ``429 TOO_MANY_AUTH_FAILURES`` with
``Retry-After``, counted in the real Redis across processes; never counted on success; and when Redis is
gone (a real server, stopped) nothing is refused for it: the failures are 401 again, never 500 or 429."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from apps.nodes.models import EnrollmentToken
from modelforge import auththrottle
from modelforge.embedded import EmbeddedRedis
from tests.fixtures import free_port, wait_until

pytestmark = pytest.mark.django_db

STATUS = "/api/v1/system/status"
ENROLL = "/api/v1/agent/enroll"
WRONG = "Bearer not-the-operator-key-not-the-operator-key"


@pytest.fixture
def limits(settings):
    settings.API_AUTH_FAILURE_LIMIT = 3
    settings.API_AUTH_FAILURE_WINDOW = 60
    return settings


def from_address(address: str, authorization: str | None = None) -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    if authorization:
        client.credentials(HTTP_AUTHORIZATION=authorization)
    return client


def right_key() -> str:
    return f"Bearer {settings.OPERATOR_API_KEY}"


def assert_throttled(response, retry_after: int) -> str:
    assert response.status_code == 429, response.content
    body = response.json()
    assert set(body) == {"code", "message", "correlation_id"}
    assert body["code"] == "TOO_MANY_AUTH_FAILURES"
    assert 0 < int(response["Retry-After"]) <= retry_after
    assert f"retry after {response['Retry-After']} s" in body["message"]
    return str(body["message"])


def test_wrong_operator_keys_reach_the_limit_and_are_answered_429_with_retry_after(limits):
    client = from_address("10.1.0.1", WRONG)
    for _ in range(limits.API_AUTH_FAILURE_LIMIT - 1):
        assert client.get(STATUS).status_code == 401
    message = assert_throttled(client.get(STATUS), 60)
    assert "10.1.0.1" in message
    assert_throttled(client.get(STATUS), 60)


def test_the_right_key_from_a_throttled_address_is_refused_too_and_the_message_says_so(limits):
    wrong = from_address("10.1.0.2", WRONG)
    for _ in range(limits.API_AUTH_FAILURE_LIMIT):
        wrong.get(STATUS)
    message = assert_throttled(from_address("10.1.0.2", right_key()).get(STATUS), 60)
    assert "the right one too" in message


def test_another_address_is_still_answered_401_and_the_right_key_works_there(limits):
    wrong = from_address("10.1.0.3", WRONG)
    for _ in range(limits.API_AUTH_FAILURE_LIMIT):
        wrong.get(STATUS)
    elsewhere = from_address("10.1.0.4", WRONG).get(STATUS)
    assert elsewhere.status_code == 401
    assert elsewhere.json()["code"] == "NOT_AUTHENTICATED"
    assert from_address("10.1.0.4", right_key()).get(STATUS).status_code == 200


def test_a_staff_session_from_a_throttled_address_is_refused_too(limits):
    wrong = from_address("10.1.0.5", WRONG)
    for _ in range(limits.API_AUTH_FAILURE_LIMIT):
        wrong.get(STATUS)
    session = from_address("10.1.0.5")
    session.force_login(User.objects.create_user("alice", password="a-long-password-1", is_staff=True))
    assert_throttled(session.get(STATUS), 60)


def test_successes_and_requests_without_a_credential_are_never_counted(limits):
    right = from_address("10.1.0.6", right_key())
    for _ in range(20):
        assert right.get(STATUS).status_code == 200
    anonymous = from_address("10.1.0.6")
    for _ in range(20):
        assert anonymous.get(STATUS).status_code == 401
    wrong = from_address("10.1.0.6", WRONG)
    for _ in range(limits.API_AUTH_FAILURE_LIMIT - 1):
        assert wrong.get(STATUS).status_code == 401
    assert right.get(STATUS).status_code == 200


def test_the_block_ends_when_the_window_passes(limits):
    limits.API_AUTH_FAILURE_WINDOW = 1  # Redis keeps real time: a one-second window, polled
    wrong = from_address("10.1.0.7", WRONG)
    for _ in range(limits.API_AUTH_FAILURE_LIMIT):
        wrong.get(STATUS)
    assert_throttled(from_address("10.1.0.7", right_key()).get(STATUS), 1)
    right = from_address("10.1.0.7", right_key())
    assert wait_until(lambda: right.get(STATUS).status_code == 200, timeout=5)


def test_unknown_enrollment_tokens_reach_the_limit_and_a_valid_token_waits_unspent(limits, operator_client):
    plain = operator_client.post("/api/v1/enrollment-tokens", {}, format="json").json()["token"]
    agent = from_address("10.2.0.1")
    for i in range(limits.API_AUTH_FAILURE_LIMIT - 1):
        response = agent.post(ENROLL, enroll_body(f"mfe_guess-{i}"), format="json")
        assert response.status_code == 401
        assert response.json()["code"] == "ENROLLMENT_TOKEN_UNKNOWN"
    assert_throttled(agent.post(ENROLL, enroll_body("mfe_guess-last"), format="json"), 60)
    message = assert_throttled(agent.post(ENROLL, enroll_body(plain), format="json"), 60)
    assert "a valid token too" in message
    assert EnrollmentToken.objects.get(token_hash__isnull=False).used_at is None
    assert from_address("10.2.0.2").post(ENROLL, enroll_body(plain), format="json").status_code == 201


def test_agent_and_operator_failures_are_counted_apart(limits):
    agent = from_address("10.2.0.3")
    for i in range(limits.API_AUTH_FAILURE_LIMIT):
        agent.post(ENROLL, enroll_body(f"mfe_guess-{i}"), format="json")
    # A broken agent on the operator's machine does not lock the operator out of the API.
    assert from_address("10.2.0.3", right_key()).get(STATUS).status_code == 200


def enroll_body(token: str) -> dict[str, str]:
    return {
        "token": token,
        "name": "gpu-box-1",
        "accelerator": "nvidia",
        "agent_version": "0.1.0",
        "agent_url": "http://10.0.0.5:8471",
    }


@pytest.fixture
def own_redis(tmp_path: Path, settings):
    """A Redis server of this test's own, so that stopping it harms no other test."""
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start(persistent=False)
    settings.CELERY_BROKER_URL = server.url
    yield server
    server.stop()


def test_with_redis_stopped_failures_are_401_again_never_500_or_429(limits, own_redis, caplog):
    wrong = from_address("10.3.0.1", WRONG)
    for _ in range(limits.API_AUTH_FAILURE_LIMIT - 1):
        assert wrong.get(STATUS).status_code == 401
    assert_throttled(wrong.get(STATUS), 60)  # counted in that server
    own_redis.stop()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(own_redis.url, socket_connect_timeout=0.3).ping()
    with caplog.at_level(logging.WARNING, logger="modelforge.auth"):
        for _ in range(limits.API_AUTH_FAILURE_LIMIT + 2):
            response = wrong.get(STATUS)
            assert response.status_code == 401, response.content
            assert response.json()["code"] == "NOT_AUTHENTICATED"
        assert from_address("10.3.0.1", right_key()).get(STATUS).status_code == 200
        agent = from_address("10.3.0.1").post(ENROLL, enroll_body("mfe_guess"), format="json")
        assert agent.status_code == 401
    unreachable = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len(unreachable) == 1  # said once per outage, not once per request
    assert "not counted" in unreachable[0].getMessage()


def test_redis_keys_expire_with_the_window(limits):
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    from_address("10.4.0.1", WRONG).get(STATUS)
    key = auththrottle.key(auththrottle.OPERATOR, "10.4.0.1")
    assert int(client.get(key) or 0) == 1
    assert 0 < client.ttl(key) <= 60


def test_invalid_node_credentials_on_artifact_downloads_are_counted_and_answered_429(limits):
    import asyncio

    from apps.artifacts import agent_views

    async def fetch(address: str, authorization: bytes | None) -> tuple[int, dict[bytes, bytes], dict]:
        headers = [(b"authorization", authorization)] if authorization else []
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/api/v1/agent/artifacts/1/files/model.safetensors",
            "headers": headers,
            "client": (address, 40000),
        }
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await agent_views.serve(scope, receive, send)
        return sent[0]["status"], dict(sent[0]["headers"]), json.loads(sent[1]["body"])

    async def scenario() -> None:
        for _ in range(5):  # no credential at all is not a guess
            status, _, body = await fetch("10.5.0.1", None)
            assert (status, body["code"]) == (401, "NODE_CREDENTIAL_INVALID")
        for i in range(limits.API_AUTH_FAILURE_LIMIT - 1):
            status, _, body = await fetch("10.5.0.1", f"Bearer mfn_guess-{i}".encode())
            assert (status, body["code"]) == (401, "NODE_CREDENTIAL_INVALID")
        status, headers, body = await fetch("10.5.0.1", b"Bearer mfn_guess-last")
        assert (status, body["code"]) == (429, "TOO_MANY_AUTH_FAILURES")
        assert set(body) == {"code", "message", "correlation_id"}
        assert headers[b"retry-after"] == b"60"
        status, _, _ = await fetch("10.5.0.2", b"Bearer mfn_guess-elsewhere")
        assert status == 401

    asyncio.run(scenario())
