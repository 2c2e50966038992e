"""Replication to a real agent over real HTTP: explicit, progress observed, the presence check true for
each of the three layouts afterwards (and false before); a corrupted transfer never becomes present,
whether the node verifies the BLAKE3 recorded at acquisition or, for an artifact acquired before those
were recorded, the SHA-256."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import blake3
import pytest
from django.conf import settings

from apps.artifacts import acquisition
from apps.artifacts.models import Artifact, Replica
from apps.nodes import agent_client
from apps.nodes.models import EnrollmentToken, Node
from tests.fixtures import PYTHON, agent_environment, start_process, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def node(live_web, tmp_path):
    _, token = EnrollmentToken.objects.mint(note="replication")
    env = agent_environment(
        live_web.url,
        tmp_path / "state",
        secret=str(settings.CLUSTER_SECRET),
        name="replica-node",
        token=token,
        models=tmp_path / "node-models",
    )
    agent = start_process([PYTHON, "-m", "agent"], env, tmp_path / "agent.log")
    assert wait_until(lambda: Node.objects.filter(name="replica-node", liveness="online").exists(), 30), (
        agent.log()
    )
    yield Node.objects.get(name="replica-node")
    os.killpg(agent.process.pid, signal.SIGTERM)
    agent.process.wait(20)


@pytest.fixture
def ready(tmp_path, settings):
    settings.ARTIFACT_STORE = tmp_path / "store"
    settings.ARTIFACT_LOCAL_ROOTS = [tmp_path / "sources"]

    def make(name: str, layout: dict[str, bytes]) -> Artifact:
        source = tmp_path / "sources" / name
        for relative, data in layout.items():
            (source / relative).parent.mkdir(parents=True, exist_ok=True)
            (source / relative).write_bytes(data)
        only = next(iter(layout)) if len(layout) == 1 else None
        artifact = Artifact.objects.create(
            name=name, source_kind="local", locator=str(source / only) if only else str(source)
        )
        acquisition.acquire(artifact)
        artifact.refresh_from_db()
        assert artifact.state == "ready", artifact.checks
        return artifact

    return make


def present(node: Node, name: str) -> bool:
    return bool(agent_client.model_presence(node, name).body.get("present"))


def replicate(operator_client, artifact: Artifact, node: Node) -> Replica:
    response = operator_client.post(
        "/api/v1/replicas", {"artifact": artifact.pk, "node": node.pk}, format="json"
    )
    assert response.status_code == 202, response.content
    return Replica.objects.get(pk=response.json()["id"])


@pytest.mark.parametrize(
    ("layout", "expected_name"),
    [
        ({"model.safetensors": b"w" * 300_000, "config.json": b"{}"}, "weights-dir"),
        ({"tiny.gguf": b"GGUF" + b"\x01" * 300_000}, "tiny.gguf"),
        ({"model.gguf": b"GGUF" + b"\x02" * 300_000, "README.md": b"x"}, "gguf-dir"),
    ],
    ids=["weights directory", "single gguf", "directory with a gguf"],
)
def test_an_artifact_is_replicated_on_request_and_then_present(
    celery_worker_process, node, ready, operator_client, layout, expected_name
):
    name = expected_name if not expected_name.endswith(".gguf") else "single"
    artifact = ready(name, layout)
    assert not present(node, expected_name)  # absent until replicated: never automatic
    replica = replicate(operator_client, artifact, node)
    assert replica.name == expected_name and replica.total_bytes == artifact.size_bytes
    assert wait_until(lambda: Replica.objects.get(pk=replica.pk).state in ("present", "failed"), 60), (
        celery_worker_process.log()[-3000:]
    )
    replica.refresh_from_db()
    assert replica.state == "present", replica.reason
    assert replica.done_bytes == artifact.size_bytes
    assert replica.copy_seconds is not None and 0 < replica.copy_seconds < 60  # the agent's own timing
    assert present(node, expected_name)


def forget_blake3(artifact: Artifact) -> None:
    """The record as a release before BLAKE3 digests left it: path, size, SHA-256."""
    artifact.files = [{key: f[key] for key in ("path", "size", "sha256")} for f in artifact.files]
    artifact.save(update_fields=["files"])


def test_a_corrupted_transfer_never_becomes_present(celery_worker_process, node, ready, operator_client):
    artifact = ready("corrupt", {"model.safetensors": b"v" * 100_000})
    assert artifact.files[0]["blake3"] == blake3.blake3(b"v" * 100_000).hexdigest()
    # One byte of the store's copy rots after acquisition: what reaches the node does not match the record.
    Path(artifact.store_path, "model.safetensors").write_bytes(b"v" * 50_000 + b"x" + b"v" * 49_999)
    replica = replicate(operator_client, artifact, node)
    assert wait_until(lambda: Replica.objects.get(pk=replica.pk).state in ("present", "failed"), 60)
    replica.refresh_from_db()
    assert replica.state == "failed"
    assert replica.reason == "model.safetensors: BLAKE3 does not match the artifact's record; discarded"
    assert not present(node, "corrupt")


def test_an_artifact_without_a_recorded_blake3_replicates_verified_by_sha256_and_gains_one(
    celery_worker_process, node, ready, operator_client, tmp_path
):
    data = os.urandom(300_000)
    artifact = ready("older", {"model.safetensors": data, "config.json": b"{}"})
    forget_blake3(artifact)
    replica = replicate(operator_client, artifact, node)
    assert wait_until(lambda: Replica.objects.get(pk=replica.pk).state in ("present", "failed"), 60)
    replica.refresh_from_db()
    assert replica.state == "present", replica.reason
    assert (tmp_path / "node-models" / "older" / "model.safetensors").read_bytes() == data
    # Its first replication queued the one-off pass that records the BLAKE3s from the store copy.
    assert wait_until(lambda: all("blake3" in f for f in Artifact.objects.get(pk=artifact.pk).files), 30), (
        celery_worker_process.log()[-3000:]
    )
    artifact.refresh_from_db()
    assert {f["path"]: f["blake3"] for f in artifact.files} == {
        "config.json": blake3.blake3(b"{}").hexdigest(),
        "model.safetensors": blake3.blake3(data).hexdigest(),
    }


def test_without_a_recorded_blake3_a_corrupted_store_copy_is_caught_by_the_sha256(
    celery_worker_process, node, ready, operator_client
):
    artifact = ready("older-corrupt", {"model.safetensors": b"v" * 100_000})
    forget_blake3(artifact)
    Path(artifact.store_path, "model.safetensors").write_bytes(b"v" * 99_999 + b"x")
    replica = replicate(operator_client, artifact, node)
    assert wait_until(lambda: Replica.objects.get(pk=replica.pk).state in ("present", "failed"), 60)
    replica.refresh_from_db()
    assert replica.state == "failed"
    assert replica.reason == "model.safetensors: SHA-256 does not match the artifact's record; discarded"
    assert not present(node, "older-corrupt")
    # The background pass does not vouch for the rotten file with a BLAKE3 of it.
    assert wait_until(
        lambda: Artifact.objects.get(pk=artifact.pk).events.filter(by="record_blake3").exists(), 30
    )
    assert "blake3" not in Artifact.objects.get(pk=artifact.pk).files[0]


def test_only_a_ready_artifact_is_replicated(operator_client, node):
    artifact = Artifact.objects.create(name="q", source_kind="local", locator="/nowhere", state="quarantined")
    response = operator_client.post(
        "/api/v1/replicas", {"artifact": artifact.pk, "node": node.pk}, format="json"
    )
    assert response.status_code == 409 and response.json()["code"] == "REPLICA_NOT_ALLOWED"


def test_the_store_is_served_to_nodes_only(live_web, ready):
    import httpx

    artifact = ready("served", {"w.safetensors": b"abc"})
    url = f"{live_web.url}/api/v1/agent/artifacts/{artifact.pk}/files/w.safetensors"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"}).status_code == 401


def test_the_store_serves_a_node_whole_files_and_ranges_through_the_web_worker(live_web, ready):
    """The web worker sends the file with sendfile (ASGI zero-copy); Range resumes from an offset."""
    import httpx

    from apps.nodes.tests.factories import make_node

    data = os.urandom(3 * (1 << 20) + 17)
    artifact = ready("ranged", {"w.safetensors": data})
    _, credential = make_node(name="range-node")
    url = f"{live_web.url}/api/v1/agent/artifacts/{artifact.pk}/files/w.safetensors"
    auth = {"Authorization": f"Bearer {credential}"}
    whole = httpx.get(url, headers=auth)
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["content-length"] == str(len(data))
    tail = httpx.get(url, headers={**auth, "Range": "bytes=1048577-"})
    assert tail.status_code == 206 and tail.content == data[1048577:]
    assert tail.headers["content-range"] == f"bytes 1048577-{len(data) - 1}/{len(data)}"
    beyond = httpx.get(
        url, headers={**auth, "Range": f"bytes={len(data)}-", "X-Correlation-ID": "range-past-the-end"}
    )
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(data)}"
    # Issue 47: the 416 was an empty body without a correlation id; every error is the envelope.
    assert beyond.headers["content-type"] == "application/json"
    assert beyond.headers["x-correlation-id"] == "range-past-the-end"
    assert beyond.json() == {
        "code": "RANGE_NOT_SATISFIABLE",
        "message": f"The range starts at byte {len(data)}; the file has {len(data)} bytes.",
        "correlation_id": "range-past-the-end",
    }
    # An empty file has no byte to start from: a 416 too (it was a 206 with a Content-Length of -1).
    empty = ready("empty", {"e.safetensors": b"", "w.safetensors": b"x"})
    nothing = httpx.get(
        f"{live_web.url}/api/v1/agent/artifacts/{empty.pk}/files/e.safetensors",
        headers={**auth, "Range": "bytes=1-"},
    )
    assert nothing.status_code == 416 and nothing.json()["code"] == "RANGE_NOT_SATISFIABLE"
    assert nothing.headers["content-range"] == "bytes */0"
