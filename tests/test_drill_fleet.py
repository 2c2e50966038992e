"""Bad-day drills with real processes: three real agents running real engines behind the real web
process and Celery worker. The sweep, reconcile, recovery and capability checks run in this process at
beat's pace (beat itself is exercised by bench/recovery), with short liveness limits in real time.

- An engine killed: SERVER_FAILED, an automatic restart with back-off, the alert cleared; with the
  attempts exhausted it stays failed with its alert, and CAPABILITY_UNSERVED while nothing serves.
- Two of three agents killed at once: NODE_MASS_LOSS, nodes held stale, no server failed until an
  operator confirms.
- One of three cut off (its agent frozen): ordinary offline, its server re-placed on another node, the
  alerts raised and cleared; when the node returns its old copy is stopped, after the replacement runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from apps.alerts.models import Alert
from apps.clusters.health import check_capabilities
from apps.clusters.models import Capability, RoutingTier
from apps.nodes import listening
from apps.nodes.models import EnrollmentToken, Node
from apps.servers import recovery
from apps.servers.models import ModelServer
from apps.servers.tasks import reconcile
from tests.fixtures import (
    PYTHON,
    RunningProcess,
    agent_environment,
    start_process,
    stop_servers_of_agent,
    sweep_until,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def three_agents(live_web, tmp_path: Path) -> Iterator[dict[str, RunningProcess]]:
    agents: dict[str, RunningProcess] = {}
    for name in ("drill-a", "drill-b", "drill-c"):
        models = tmp_path / name / "models"
        (models / "tiny-model").mkdir(parents=True)
        (models / "tiny-model" / "config.json").write_text("{}")
        _, token = EnrollmentToken.objects.mint(note="drill")
        env = agent_environment(
            live_web.url,
            tmp_path / name / "state",
            secret=str(settings.CLUSTER_SECRET),
            name=name,
            token=token,
            models=models,
        )
        agents[name] = start_process([PYTHON, "-m", "agent"], env, tmp_path / f"{name}.log")
    assert wait_until(lambda: Node.objects.in_liveness("online").count() == 3, 40), "\n".join(
        a.log()[-1500:] for a in agents.values()
    )
    yield agents
    for agent in agents.values():
        if agent.process.poll() is None:
            os.kill(agent.process.pid, signal.SIGCONT)
            os.killpg(agent.process.pid, signal.SIGTERM)
            agent.process.wait(20)
    for name in agents:
        stop_servers_of_agent(tmp_path / name / "state")  # the engines an agent killed mid-test left running


def place(operator_client, name: str, node: str | None = None) -> None:
    body = {"name": name, "profile": "test-echo", "model": "tiny-model"}
    if node:
        body["node"] = node
    created = operator_client.post("/api/v1/servers", body, format="json")
    assert created.status_code == 201, created.content


def server(name: str) -> ModelServer:
    return ModelServer.objects.select_related("node").get(name=name)


def running(*names: str) -> bool:
    return ModelServer.objects.filter(name__in=names, state="running").count() == len(names)


def answers(port: int | None) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def open_alert(code: str, subject: str) -> Alert | None:
    return Alert.objects.open().filter(code=code, subject_name=subject).first()


def test_a_killed_engine_alerts_restarts_with_back_off_and_gives_up_after_its_attempts(
    celery_worker_process, three_agents, operator_client, settings
):
    settings.SERVER_RESTART_BACKOFF = 1
    settings.SERVER_RESTART_MAX_ATTEMPTS = 2
    place(operator_client, "engine-1", node="drill-a")
    assert wait_until(lambda: running("engine-1"), 60), celery_worker_process.log()[-3000:]
    capability = Capability.objects.create(name="drill.echo@1")
    RoutingTier.objects.create(capability=capability, server=server("engine-1"))
    assert check_capabilities() == []

    def kill_engine() -> int | None:
        victim = server("engine-1")
        os.killpg(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
        assert wait_until(lambda: reconcile()["failed"] == 1, 15)
        return victim.pid

    for attempt in (1, 2):
        old_pid = kill_engine()
        failed = server("engine-1")
        assert (failed.state, failed.failure_code) == ("failed", "PROCESS_LOST")
        recovery.raise_failed_alerts()
        alert = open_alert("SERVER_FAILED", "engine-1")
        assert alert is not None and f"Restart {attempt} of 2" in alert.message
        assert check_capabilities() == ["drill.echo@1"]
        unserved = open_alert("CAPABILITY_UNSERVED", "drill.echo@1")
        assert unserved is not None and unserved.severity == "critical"
        # Not before its back-off (1 s, then 2 s), then placed again on its own node and started.
        assert recovery.recover(failed.stopped_at)["restarted"] == 0
        assert wait_until(lambda: recovery.recover()["restarted"] == 1, 10)
        assert wait_until(lambda: running("engine-1"), 60), celery_worker_process.log()[-3000:]
        back = server("engine-1")
        assert back.pid != old_pid and back.node is not None and back.node.name == "drill-a"
        assert back.restart_attempts == attempt
        recovery.recover()
        assert open_alert("SERVER_FAILED", "engine-1") is None
        assert check_capabilities() == []
        assert open_alert("CAPABILITY_UNSERVED", "drill.echo@1") is None
        assert answers(back.port)

    # Attempts exhausted: it stays failed, with the alert saying so.
    kill_engine()
    assert recovery.recover()["restarted"] == 0
    exhausted = open_alert("SERVER_FAILED", "engine-1")
    assert exhausted is not None and "Automatic restarts are exhausted (2)" in exhausted.message
    assert server("engine-1").state == "failed"
    assert check_capabilities() == ["drill.echo@1"]


def test_two_of_three_agents_killed_at_once_are_held_until_an_operator_confirms(
    celery_worker_process, three_agents, operator_client, settings
):
    for name, node in (("held-a", "drill-a"), ("held-b", "drill-b")):
        place(operator_client, name, node=node)
    assert wait_until(lambda: running("held-a", "held-b"), 60), celery_worker_process.log()[-3000:]
    for name in ("drill-a", "drill-b"):
        three_agents[name].process.kill()
        three_agents[name].process.wait(10)
    # "At once" is one sweep: both past the offline limit when it looks. Each agent's last heartbeat has
    # its own phase (up to an interval apart), so a sweep every 0.5 s from the kill could see them one by
    # one, each a single node; the guard is drilled with the sweep arriving after both went silent.
    settings.NODE_STALE_AFTER, settings.NODE_OFFLINE_AFTER = 2, 3
    time.sleep(settings.NODE_OFFLINE_AFTER + 1.5)
    assert sweep_until(
        settings, lambda: open_alert("NODE_MASS_LOSS", "fleet liveness") is not None, timeout=60
    )
    # Held: well past the offline limit, stale, and no server failed.
    assert not sweep_until(settings, lambda: Node.objects.in_liveness("offline").exists(), timeout=6)
    assert {node.name: node.liveness_now for node in Node.objects.with_liveness()} == {
        "drill-a": "stale",
        "drill-b": "stale",
        "drill-c": "online",
    }
    assert running("held-a", "held-b")
    alert = open_alert("NODE_MASS_LOSS", "fleet liveness")
    assert alert is not None and alert.message.startswith("2 of 3 online nodes went silent at once")

    listening.confirm_mass_loss(by="operator")
    assert sweep_until(settings, lambda: Node.objects.in_liveness("offline").count() == 2)
    assert {s.failure_code for s in ModelServer.objects.filter(name__in=["held-a", "held-b"])} == {
        "NODE_OFFLINE"
    }
    assert open_alert("NODE_MASS_LOSS", "fleet liveness") is None


def test_a_node_cut_off_has_its_server_re_placed_and_its_old_copy_stopped_once_the_replacement_runs(
    celery_worker_process, three_agents, operator_client, settings
):
    settings.SERVER_RESTART_BACKOFF = 1
    place(operator_client, "moving", node="drill-a")
    assert wait_until(lambda: running("moving"), 60), celery_worker_process.log()[-3000:]
    old_port = server("moving").port
    # The agent freezes (a partition): no heartbeat, no answer, but its engine keeps running.
    frozen = three_agents["drill-a"]
    os.kill(frozen.process.pid, signal.SIGSTOP)
    try:
        assert sweep_until(settings, lambda: server("moving").state == "failed")
        assert server("moving").failure_code == "NODE_OFFLINE"
        assert open_alert("node_offline", "drill-a") is not None
        assert Alert.objects.open().filter(code="NODE_MASS_LOSS").count() == 0
        recovery.raise_failed_alerts()
        assert open_alert("SERVER_FAILED", "moving") is not None
        # Re-placed elsewhere by the restart policy, and started there.
        assert wait_until(lambda: recovery.recover()["restarted"] == 1, 10)
        assert wait_until(lambda: running("moving"), 60), celery_worker_process.log()[-3000:]
        moved = server("moving")
        assert moved.node is not None and moved.node.name in ("drill-b", "drill-c")
        recovery.recover()
        assert open_alert("SERVER_FAILED", "moving") is None
        assert answers(old_port)  # the old copy was never touched while its node was away
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    # The node returns; the replacement runs, so reconcile stops the old copy (an event says why).
    assert wait_until(lambda: Node.objects.get(name="drill-a").liveness_now == "online", 20)
    assert open_alert("node_offline", "drill-a") is None
    assert wait_until(lambda: reconcile()["stopped"] == 1, 15)
    assert not answers(old_port)
    assert answers(server("moving").port)
    assert (
        server("moving")
        .events.filter(detail__startswith="the copy on drill-a stopped: placed again")
        .exists()
    )


def test_books_naming_a_node_that_no_longer_runs_the_server_never_stop_the_live_copy(
    celery_worker_process, three_agents, operator_client
):
    """Restored from a backup taken before a re-placement: the books say drill-a, the process runs on
    drill-b. Reconciling drill-b first must not stop it on the books' word: drill-a's agent is asked."""
    from apps.servers.lifecycle import reconcile_node

    place(operator_client, "restored", node="drill-b")
    assert wait_until(lambda: running("restored"), 60), celery_worker_process.log()[-3000:]
    live = server("restored")
    ModelServer.objects.filter(pk=live.pk).update(node=Node.objects.get(name="drill-a"), port=1, pid=1)

    done = reconcile_node(Node.objects.get(name="drill-b"))
    assert (done.stopped, done.adopted) == (0, 1)
    back = server("restored")
    assert back.node is not None and (back.node.name, back.port, back.state) == (
        "drill-b",
        live.port,
        "running",
    )
    assert back.events.filter(detail__startswith="adopted on drill-b: the books named drill-a").exists()
    assert answers(live.port)
    assert reconcile() == {"failed": 0, "adopted": 0, "recorded": 0, "stopped": 0}
