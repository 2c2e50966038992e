"""Real echo backends registered as running model servers on a live node, and routing around them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.clusters.models import Capability, ClientCredential, Cluster, ClusterMember, RoutingTier
from apps.nodes.tests.factories import beat, heartbeat_report, make_node
from apps.servers.models import ModelServer
from tests.fixtures import PYTHON, RunningProcess, free_port, http_ok, start_process, wait_until


def echo_backend(tmp_path: Path, name: str) -> tuple[RunningProcess, int]:
    """A real HTTP engine process (agent/engines/echo.py) on a free loopback port."""
    port = free_port()
    process = start_process(
        [PYTHON, "-m", "agent.engines.echo", "--port", str(port), "--model", name],
        {},
        tmp_path / f"{name}.log",
    )
    assert wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 20), process.log()
    return process, port


def loopback_node(name: str = "gw-node"):
    """An online, enabled node whose servers listen on 127.0.0.1."""
    node, credential = make_node(name=name, accelerator="cpu", agent_url="http://127.0.0.1:1")
    beat(credential, {**heartbeat_report(gpus=0), "agent_url": "http://127.0.0.1:1"})
    node.refresh_from_db()
    return node


def running_server(node: Any, name: str, port: int) -> ModelServer:
    server = ModelServer.objects.create(
        name=name, profile="test-echo", model=name, node=node, port=port, state="running"
    )
    return server


def cluster_with(name: str, servers: list[tuple[ModelServer, int]], algorithm: str = "weighted_round_robin"):
    cluster = Cluster.objects.create(name=name, algorithm=algorithm)
    for server, weight in servers:
        ClusterMember.objects.create(cluster=cluster, name=server.name, weight=weight, server=server)
    return cluster


def bind(
    capability: str,
    *,
    cluster: Cluster | None = None,
    server: ModelServer | None = None,
    tier: int = 0,
    project: str = "",
    weight: int = 1,
) -> RoutingTier:
    cap, _ = Capability.objects.get_or_create(name=capability)
    return RoutingTier.objects.create(
        capability=cap, cluster=cluster, server=server, tier=tier, project=project, weight=weight
    )


def credential(scopes: list[str], **kw: Any) -> str:
    _, plain = ClientCredential.objects.mint(name="app", scopes=scopes, **kw)
    return plain
