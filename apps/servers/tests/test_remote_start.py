"""Remote starts for real: the API places a server, a Celery worker asks the node's agent whether the
model is present and launches it, the agent runs a real HTTP process, reports it running, stops it on
request; a missing model is refused by its key; a node going offline fails its servers in the books."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import httpx
import pytest
from django.conf import settings

from apps.nodes.models import EnrollmentToken, Node
from apps.servers.models import ModelServer
from tests.fixtures import (
    PYTHON,
    agent_environment,
    start_process,
    stop_servers_of_agent,
    sweep_until,
    wait_until,
)

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
    stop_servers_of_agent(tmp_path / "state")  # the engines an agent killed mid-test left running


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
    # Seeds, "A remote start is refused outright": at placement, the node's report not naming the model.
    refused = operator_client.post(
        "/api/v1/servers",
        {"name": "echo-2", "profile": "test-echo", "model": "not-there", "node": "worker-node"},
        format="json",
    )
    assert refused.status_code == 409
    assert refused.json()["code"] == "model_not_present_on_node"
    assert "Replicate the model to that node first." in refused.json()["message"]
    assert not ModelServer.objects.filter(name="echo-2").exists()
    # The launch-time check stays the second line of defence: a report that names a model the node no
    # longer has (removed since its last heartbeat) fails at launch, by the same key.
    Node.objects.filter(name="worker-node").update(
        models_present=[{"name": "not-there", "kind": "weights_directory"}]
    )
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
    celery_worker_process, agent_node, operator_client, settings
):
    operator_client.post(
        "/api/v1/servers", {"name": "echo-3", "profile": "test-echo", "model": "tiny-model"}, format="json"
    )
    assert wait_until(lambda: state_of("echo-3") == "running", 60), celery_worker_process.log()[-3000:]
    os.killpg(agent_node.process.pid, signal.SIGTERM)
    agent_node.process.wait(20)
    assert sweep_until(settings, lambda: state_of("echo-3") == "failed")
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
    assert reconcile() == NOTHING  # the agent runs it: nothing to change

    # The agent restarts (its servers stop with it) and comes back with the same identity.
    os.killpg(agent_node.process.pid, signal.SIGTERM)
    agent_node.process.wait(20)
    restarted = start_process([PYTHON, "-m", "agent"], agent_node.env, tmp_path / "agent-again.log")
    try:
        node = Node.objects.get(name="worker-node")
        before = node.last_heartbeat_at
        assert wait_until(lambda: Node.objects.get(name="worker-node").last_heartbeat_at != before, 30)
        assert reconcile() == {**NOTHING, "failed": 1}
        server = ModelServer.objects.get(name="echo-4")
        assert server.state == "failed" and server.failure_code == "PROCESS_LOST"
    finally:
        os.killpg(restarted.process.pid, signal.SIGTERM)
        restarted.process.wait(20)


NOTHING = {"failed": 0, "adopted": 0, "recorded": 0, "stopped": 0}


def place_and_run(operator_client, name: str, celery_worker_process) -> ModelServer:
    created = operator_client.post(
        "/api/v1/servers", {"name": name, "profile": "test-echo", "model": "tiny-model"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert wait_until(lambda: state_of(name) == "running", 60), celery_worker_process.log()[-3000:]
    return ModelServer.objects.get(name=name)


def answers(server: ModelServer) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_process_failed_only_in_the_books_is_adopted_not_stopped(
    celery_worker_process, agent_node, operator_client
):
    from apps.servers.tasks import reconcile

    server = place_and_run(operator_client, "echo-5", celery_worker_process)
    # As after NODE_OFFLINE while the agent was only unreachable: the books say failed, the process runs.
    server.fail("NODE_OFFLINE", "its node went offline")
    assert answers(server)
    assert reconcile() == {**NOTHING, "adopted": 1}
    server.refresh_from_db()
    assert (server.state, server.failure_code) == ("running", "")
    assert answers(server)
    assert server.events.filter(to_state="running", detail__startswith="adopted").exists()


def test_a_process_the_books_never_saw_is_re_recorded_from_the_agent(
    celery_worker_process, agent_node, operator_client
):
    """Books restored from a backup older than the server: it is recorded again, never stopped."""
    from apps.servers.tasks import reconcile

    server = place_and_run(operator_client, "echo-6", celery_worker_process)
    pk, port = server.pk, server.port
    ModelServer.objects.filter(pk=pk).delete()
    assert reconcile() == {**NOTHING, "recorded": 1}
    again = ModelServer.objects.get(pk=pk)
    assert (again.name, again.profile, again.model, again.state, again.port) == (
        "echo-6",
        "test-echo",
        "tiny-model",
        "running",
        port,
    )
    assert again.node is not None and again.node.name == "worker-node"
    assert again.events.filter(detail__startswith="re-recorded from the agent of worker-node").exists()
    assert answers(again)
    assert reconcile() == NOTHING  # recorded once


def test_a_process_is_stopped_when_an_operator_deleted_its_server(
    celery_worker_process, agent_node, operator_client
):
    from apps.servers import services
    from apps.servers.models import ServerTombstone
    from apps.servers.tasks import reconcile

    server = place_and_run(operator_client, "echo-7", celery_worker_process)
    server.fail("NODE_OFFLINE", "its node went offline")  # the operator cannot reach it: deletes it anyway
    services.delete(ModelServer.objects.get(pk=server.pk), by="alice")
    assert ServerTombstone.objects.filter(server_id=server.pk, deleted_by="alice").exists()
    assert answers(server)
    assert reconcile() == {**NOTHING, "stopped": 1}
    assert not answers(server)
    assert not ModelServer.objects.filter(pk=server.pk).exists()
    assert not ServerTombstone.objects.exists()  # its work done
    assert reconcile() == NOTHING


def test_a_process_is_stopped_when_an_operator_stopped_its_server(
    celery_worker_process, agent_node, operator_client
):
    from apps.servers.tasks import reconcile

    server = place_and_run(operator_client, "echo-8", celery_worker_process)
    # The stop reached the books but not the agent (the agent was away when it was sent).
    server.transition("stopping", detail="stop requested by alice")
    server.transition("stopped", detail="stopped by its agent")
    assert answers(server)
    assert reconcile() == {**NOTHING, "stopped": 1}
    assert not answers(server)
    event = server.events.filter(detail__contains="the copy on worker-node stopped").get()
    assert "stop requested by alice" in event.detail
