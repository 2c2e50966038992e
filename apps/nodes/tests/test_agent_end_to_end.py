"""The real agent against the real control plane over real HTTP, in CPU mode: enroll, heartbeat, online;
stopped → stale → offline by the sweep (time controlled), node_offline raised, cleared on the next
heartbeat; a restart keeps the identity; a cluster-secret mismatch is surfaced with the node's name."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from apps.alerts.models import Alert
from apps.nodes.models import EnrollmentToken, Node
from apps.nodes.tasks import ping_node
from tests.fixtures import PYTHON, agent_environment, free_port, start_process, sweep_until, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


def meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def agent_env(live_web, state: Path, token: str | None, secret: str, name: str) -> dict[str, str]:
    env = agent_environment(live_web.url, state / "volume", secret=secret, name=name, token=token)
    env["HOME"] = str(state / "home")
    return env


def start_agent(env: dict[str, str], log: Path):
    return start_process([PYTHON, "-m", "agent"], env, log)


def stop(agent) -> None:
    if agent.process.poll() is None:
        os.killpg(agent.process.pid, signal.SIGTERM)
    assert agent.process.wait(20) == 0, agent.log()[-2000:]


def online(name: str) -> bool:
    return Node.objects.filter(name=name, liveness="online").exists()


def test_an_agent_enrolls_reports_goes_offline_and_comes_back_with_the_same_identity(
    live_web, tmp_path, settings
):
    test_settings = settings
    _, token = EnrollmentToken.objects.mint(note="end to end")
    env = agent_env(live_web, tmp_path, token, str(settings.CLUSTER_SECRET), "e2e-node")
    agent = start_agent(env, tmp_path / "agent-1.log")
    try:
        assert wait_until(lambda: online("e2e-node"), 30), agent.log()[-3000:]
        node = Node.objects.get(name="e2e-node")
        assert node.accelerator == "cpu"
        assert node.memory_total_bytes == meminfo_total_bytes()  # real figures of this machine
        assert node.cpu_count and node.cpu_count >= 1
        assert node.shm_total_bytes and node.shm_total_bytes > 0
        assert node.is_assignable()
        identity = json.loads((tmp_path / "volume" / "identity.json").read_text())
        assert identity["node_id"] == str(node.pk)
        assert oct((tmp_path / "volume" / "identity.json").stat().st_mode & 0o777) == "0o600"
        # The control plane reaches the agent with a signed call.
        assert ping_node(str(node.pk)) == {"ok": True, "status": 200}
        node.refresh_from_db()
        assert node.agent_reached_at is not None and node.secret_mismatch_at is None
    finally:
        stop(agent)

    # Silence, then sweeps in real time with short limits (stale after 2 s, offline after 3 s).
    assert sweep_until(test_settings, lambda: not online("e2e-node"))
    assert sweep_until(
        test_settings, lambda: Node.objects.filter(name="e2e-node", liveness="offline").exists()
    )
    assert list(
        Node.objects.get(name="e2e-node").events.filter(kind="liveness").values_list("to_liveness", flat=True)
    )[:2] == ["offline", "stale"]
    alert = Alert.objects.open().get(code="node_offline")
    assert alert.severity == "critical" and alert.subject_name == "e2e-node"
    assert not Node.objects.get(name="e2e-node").is_assignable()

    # Restart without a token: the persisted identity is used, nothing enrolls again.
    restart_env = {k: v for k, v in env.items() if k != "MODELFORGE_AGENT_ENROLLMENT_TOKEN"}
    agent = start_agent(restart_env, tmp_path / "agent-2.log")
    try:
        assert wait_until(lambda: online("e2e-node"), 30), agent.log()[-3000:]
        assert not Alert.objects.open().filter(code="node_offline").exists()
        assert Alert.objects.get(code="node_offline").cleared_at is not None
        assert Node.objects.count() == 1
        assert str(Node.objects.get().pk) == identity["node_id"]
        assert list(
            Node.objects.get()
            .events.filter(kind="liveness")
            .order_by("id")
            .values_list("to_liveness", flat=True)
        ) == ["online", "stale", "offline", "online"]
    finally:
        stop(agent)


def test_a_cluster_secret_mismatch_is_surfaced_with_the_node_name(live_web, tmp_path, operator_client):
    _, token = EnrollmentToken.objects.mint(note="mismatch")
    wrong_secret = "not-the-control-planes-secret"
    env = agent_env(live_web, tmp_path, token, wrong_secret, "drifted-node")
    agent = start_agent(env, tmp_path / "agent.log")
    try:
        assert wait_until(lambda: online("drifted-node"), 30), agent.log()[-3000:]
        node = Node.objects.get(name="drifted-node")
        result = ping_node(str(node.pk))
        assert result["ok"] is False and result["code"] == "CLUSTER_SECRET_MISMATCH"
        assert "drifted-node" in result["message"]
    finally:
        stop(agent)
    node.refresh_from_db()
    assert node.secret_mismatch_at is not None
    assert node.events.filter(kind="secret_mismatch").exists()
    alert = Alert.objects.open().get(code="cluster_secret_mismatch")
    assert alert.subject_name == "drifted-node" and alert.severity == "critical"
    assert "drifted-node" in alert.message
    api = operator_client.get(f"/api/v1/nodes/{node.pk}").json()
    assert api["cluster_secret_mismatch"] is True


def test_an_unreachable_agent_is_recorded_not_hung_on(tmp_path):
    from apps.nodes.tests.factories import make_node

    node, _ = make_node(name="gone", agent_url=f"http://127.0.0.1:{free_port()}")
    result = ping_node(str(node.pk))
    assert result["ok"] is False and result["code"] == "AGENT_UNREACHABLE"
    node.refresh_from_db()
    assert "ConnectError" in node.agent_error
