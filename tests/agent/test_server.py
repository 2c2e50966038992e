"""The agent's port: every call signed with the cluster secret; ping and presence per the contract."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent import __version__
from agent.protocol import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign, signed_headers, verify
from agent.server import AgentContext, AgentServer
from tests.agent.support import CLUSTER_SECRET

NODE_ID = "0b8e5b4e-8f7a-4a55-9f51-7d2f5c1e9a10"


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "bge-m3").mkdir(parents=True)
    (root / "bge-m3" / "model.safetensors").write_bytes(b"weights")
    (root / "phi-3.gguf").write_bytes(b"GGUF")
    (root / "mistral").mkdir()
    (root / "mistral" / "mistral-7b.Q4_K_M.gguf").write_bytes(b"GGUF")
    return root


@pytest.fixture
def agent_url(models: Path) -> Iterator[str]:
    server = AgentServer(("127.0.0.1", 0), AgentContext(CLUSTER_SECRET, NODE_ID, "gpu-01", models))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def call(
    base: str,
    method: str,
    path: str,
    payload: Any = None,
    *,
    secret: str = CLUSTER_SECRET,
    now: float | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = (
        b"" if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
    )
    signed = signed_headers(secret, method, path, body, now=now)
    return httpx.request(method, base + path, content=body, headers=signed | (headers or {}))


def test_a_signed_ping_is_answered(agent_url: str) -> None:
    response = call(agent_url, "GET", "/v1/ping")

    assert response.status_code == 200
    assert response.json() == {"node_id": NODE_ID, "node_name": "gpu-01", "agent_version": __version__}


def test_a_wrong_cluster_secret_is_refused_with_the_envelope(agent_url: str) -> None:
    response = call(
        agent_url,
        "GET",
        "/v1/ping",
        secret="not-the-cluster-secret",
        headers={"X-Correlation-ID": "cp-req-12345678"},
    )

    assert response.status_code == 401
    assert response.json()["code"] == "CLUSTER_SECRET_MISMATCH"
    assert set(response.json()) == {"code", "message", "correlation_id"}
    assert response.json()["correlation_id"] == "cp-req-12345678"


def test_an_unsigned_request_is_refused_with_a_fresh_correlation_id(agent_url: str) -> None:
    response = httpx.get(agent_url + "/v1/ping", headers={"X-Correlation-ID": "bad id with spaces"})

    assert response.status_code == 401
    assert response.json()["code"] == "CLUSTER_SECRET_MISMATCH"
    assert len(response.json()["correlation_id"]) == 32


def test_a_stale_timestamp_is_refused_as_expired(agent_url: str) -> None:
    response = call(agent_url, "GET", "/v1/ping", now=time.time() - 301)

    assert response.status_code == 401
    assert response.json()["code"] == "SIGNATURE_EXPIRED"


def test_a_timestamp_from_the_future_is_refused_as_expired(agent_url: str) -> None:
    assert call(agent_url, "GET", "/v1/ping", now=time.time() + 400).json()["code"] == "SIGNATURE_EXPIRED"


def test_a_signature_over_another_body_is_refused(agent_url: str) -> None:
    signed = signed_headers(CLUSTER_SECRET, "POST", "/v1/presence", b'{"model": "bge-m3"}')

    response = httpx.post(agent_url + "/v1/presence", content=b'{"model": "other"}', headers=signed)

    assert response.status_code == 401
    assert response.json()["code"] == "CLUSTER_SECRET_MISMATCH"


@pytest.mark.parametrize(
    ("model", "present", "kind"),
    [
        ("bge-m3", True, "weights_directory"),
        ("phi-3.gguf", True, "gguf_file"),
        ("mistral", True, "gguf_directory"),
        ("absent", False, None),
    ],
)
def test_presence_answers_per_the_contract(
    agent_url: str, model: str, present: bool, kind: str | None
) -> None:
    response = call(agent_url, "POST", "/v1/presence", {"model": model})

    assert response.status_code == 200
    assert response.json() == {"model": model, "present": present, "kind": kind}


@pytest.mark.parametrize(
    "payload",
    [
        {"model": "../../etc"},
        {"model": "/etc/passwd"},
        {"model": 3},
        {"name": "bge-m3"},
        ["bge-m3"],
        b"not json",
    ],
)
def test_a_bad_presence_body_is_a_validation_error(agent_url: str, payload: Any) -> None:
    response = call(agent_url, "POST", "/v1/presence", payload)

    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_ERROR"
    assert set(response.json()) == {"code", "message", "correlation_id"}


def test_an_unknown_path_is_not_found(agent_url: str) -> None:
    response = call(agent_url, "GET", "/v1/launch")

    assert response.status_code == 404
    assert response.json()["code"] == "NOT_FOUND"


def test_a_known_path_with_the_wrong_method_is_refused(agent_url: str) -> None:
    response = call(agent_url, "GET", "/v1/presence")

    assert response.status_code == 405
    assert response.headers["Allow"] == "POST"


def test_sign_is_hmac_sha256_over_timestamp_method_path_and_body() -> None:
    import hashlib
    import hmac

    expected = hmac.new(
        b"k" * 16, b'1700000000\nPOST\n/v1/presence\n{"model":"x"}', hashlib.sha256
    ).hexdigest()

    assert sign("k" * 16, 1700000000, "post", "/v1/presence", b'{"model":"x"}') == expected
    assert (
        verify("k" * 16, "1700000000", expected, "POST", "/v1/presence", b'{"model":"x"}', now=1700000100)
        is None
    )
    refusal = verify("k" * 16, "1700000000", expected, "POST", "/v1/presence", b"{}", now=1700000100)
    assert refusal is not None and refusal.code == "CLUSTER_SECRET_MISMATCH"
    headers = signed_headers("k" * 16, "GET", "/v1/ping", now=1700000000)
    assert headers[TIMESTAMP_HEADER] == "1700000000"
    assert headers[SIGNATURE_HEADER] == sign("k" * 16, 1700000000, "GET", "/v1/ping")


@pytest.mark.parametrize(
    "item",
    [
        {"path": "w.safetensors", "size": 3},
        {"path": "w.safetensors", "size": 3, "sha256": "not-hex"},
        {"path": "w.safetensors", "size": 3, "sha256": "", "blake3": "A" * 64},
    ],
    ids=["no digest", "not a digest", "an upper-case blake3 and no sha256"],
)
def test_a_replica_file_without_a_digest_the_agent_can_verify_is_refused_before_any_copy(
    agent_url: str, models: Path, item: dict[str, Any]
) -> None:
    payload = {"replica_id": "r1", "name": "w", "base_url": "/files", "files": [item]}
    response = call(agent_url, "POST", "/v1/replicas", payload)
    assert response.status_code == 400
    assert response.json()["code"] == "REPLICA_DIGEST_MISSING"
    assert "w.safetensors" in response.json()["message"]
    assert not (models / ".incoming").exists()
