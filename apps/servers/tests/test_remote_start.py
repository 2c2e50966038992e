"""Remote starts for real: the API places a server, a Celery worker asks the node's agent whether the
model is present and launches it, the agent runs a real HTTP process, reports it running, stops it on
request; a missing model is refused by its key; a node going offline fails its servers in the books."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from datetime import timedelta

import httpx
import pytest
import time_machine
from django.conf import settings

from apps.nodes.liveness import sweep
from apps.nodes.models import EnrollmentToken, Node
from apps.servers.models import ModelServer
from tests.fixtures import PYTHON, agent_environment, start_process, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def agent_node(live_web, tmp_path):
    """A real agent (CPU mode) enrolled against the live control plane, with one model on its disk."""
    models = tmp_path / "models"
    (models / "tiny-model").mkdir(parents=True)
    (models / "tiny-model" / "config.json").write_text("{}")
    _, token = EnrollmentToken.objects.mint(note="remote start")
    env = agent_environment(
        live_web.url,
        tmp_path / "state",
        secret=str(settings.CLUSTER_SECRET),
        name="worker-node",
        token=token,
        models=models,
    )
    agent = start_process([PYTHON, "-m", "agent"], env, tmp_path / "agent.log")
    agent.env = {k: v for k, v in env.items() if k != "MODELFORGE_AGENT_ENROLLMENT_TOKEN"}  # type: ignore[attr-defined]
    assert wait_until(lambda: Node.objects.filter(name="worker-node", liveness="online").exists(), 30), (
        agent.log()
    )
    yield agent
    if agent.process.poll() is None:
        os.killpg(agent.process.pid, signal.SIGTERM)
        agent.process.wait(20)


def state_of(name: str) -> str:
    return ModelServer.objects.values_list("state", flat=True).get(name=name)


def test_a_server_is_launched_runs_answers_and_stops(celery_worker_process, agent_node, operator_client):
    created = operator_client.post(
        "/api/v1/servers", {"name": "echo-1", "profile": "test-echo", "model": "tiny-model"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert wait_until(lambda: state_of("echo-1") in ("running", "failed"), 60), (
        celery_worker_process.log()[-3000:] + agent_node.log()[-2000:]
    )
    server = ModelServer.objects.get(name="echo-1")
    assert server.state == "running", (server.failure_code, server.failure_message)
    assert server.port and server.pid
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/models", timeout=5) as response:
        assert json.loads(response.read())["data"][0]["id"] == "tiny-model"

    assert operator_client.post(f"/api/v1/servers/{server.pk}/stop").status_code == 202
    assert wait_until(lambda: state_of("echo-1") == "stopped", 30), celery_worker_process.log()[-3000:]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2)
    history = list(server.events.order_by("id").values_list("to_state", flat=True))
    assert history == ["placing", "starting", "running", "stopping", "stopped"]
    assert not server.reservations.exists()


def test_a_model_missing_on_the_node_is_refused_by_its_key(
    celery_worker_process, agent_node, operator_client
):
    created = operator_client.post(
        "/api/v1/servers", {"name": "echo-2", "profile": "test-echo", "model": "not-there"}, format="json"
    )
    assert created.status_code == 201
    assert wait_until(lambda: state_of("echo-2") == "failed", 60), celery_worker_process.log()[-3000:]
    server = ModelServer.objects.get(name="echo-2")
    assert server.failure_code == "model_not_present_on_node"
    assert "Replicate the model to that node first." in server.failure_message
    assert not server.reservations.exists()


def test_servers_of_a_node_that_goes_offline_are_failed_in_the_books(
    celery_worker_process, agent_node, operator_client
):
    operator_client.post(
        "/api/v1/servers", {"name": "echo-3", "profile": "test-echo", "model": "tiny-model"}, format="json"
    )
    assert wait_until(lambda: state_of("echo-3") == "running", 60), celery_worker_process.log()[-3000:]
    os.killpg(agent_node.process.pid, signal.SIGTERM)
    agent_node.process.wait(20)
    last = Node.objects.get(name="worker-node").last_heartbeat_at
    assert last is not None
    with time_machine.travel(last + timedelta(seconds=settings.NODE_OFFLINE_AFTER + 1), tick=False):
        sweep()
    server = ModelServer.objects.get(name="echo-3")
    assert server.state == "failed" and server.failure_code == "NODE_OFFLINE"
    assert server.events.filter(to_state="failed").exists()
    assert not server.reservations.exists()


def test_a_server_its_agent_no_longer_runs_is_failed_not_kept_running(
    celery_worker_process, agent_node, operator_client, tmp_path
):
    from apps.servers.tasks import reconcile

    operator_client.post(
        "/api/v1/servers", {"name": "echo-4", "profile": "test-echo", "model": "tiny-model"}, format="json"
    )
    assert wait_until(lambda: state_of("echo-4") == "running", 60), celery_worker_process.log()[-3000:]
    assert reconcile() == {"failed": 0, "orphans_stopped": 0}  # the agent runs it: nothing to change

    # The agent restarts (its servers stop with it) and comes back with the same identity.
    os.killpg(agent_node.process.pid, signal.SIGTERM)
    agent_node.process.wait(20)
    restarted = start_process([PYTHON, "-m", "agent"], agent_node.env, tmp_path / "agent-again.log")
    try:
        node = Node.objects.get(name="worker-node")
        before = node.last_heartbeat_at
        assert wait_until(lambda: Node.objects.get(name="worker-node").last_heartbeat_at != before, 30)
        assert reconcile() == {"failed": 1, "orphans_stopped": 0}
        server = ModelServer.objects.get(name="echo-4")
        assert server.state == "failed" and server.failure_code == "PROCESS_LOST"
    finally:
        os.killpg(restarted.process.pid, signal.SIGTERM)
        restarted.process.wait(20)


def test_a_process_the_books_no_longer_hold_as_live_is_stopped(
    celery_worker_process, agent_node, operator_client
):
    from apps.servers.tasks import reconcile

    operator_client.post(
        "/api/v1/servers", {"name": "echo-5", "profile": "test-echo", "model": "tiny-model"}, format="json"
    )
    assert wait_until(lambda: state_of("echo-5") == "running", 60), celery_worker_process.log()[-3000:]
    server = ModelServer.objects.get(name="echo-5")
    # As after NODE_OFFLINE while the agent was only unreachable: the books say failed, the process runs.
    server.fail("NODE_OFFLINE", "its node went offline")
    assert httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2).status_code == 200
    assert reconcile() == {"failed": 0, "orphans_stopped": 1}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2)
