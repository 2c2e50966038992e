"""Remote starts and stops through the node's agent, and what happens when a node goes away.

Every call to an agent is signed (``apps.nodes.agent_client``) and runs in a Celery task.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.dispatch import receiver
from django.utils import timezone

from apps.nodes import agent_client
from apps.nodes.models import Node
from apps.nodes.signals import nodes_went_offline
from apps.servers import codes
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer, Reservation, ServerEvent
from apps.servers.signals import server_state_changed
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)


def launch(server: ModelServer) -> None:
    """Step one of a remote start: ask the node whether the model is present, then launch.

    Refused outright, each with its key: ``model_not_present_on_node`` ("Replicate the model to that
    node first."). The local-node-only keys are decided at placement, before anything is reserved.
    """
    node = server.node
    assert node is not None
    profile = settings.RUNTIME_PROFILES.get(server.profile)
    if profile is None:
        server.fail(codes.LAUNCH_FAILED, f"Runtime profile {server.profile!r} is no longer configured.")
        return
    if server.artifact_id is not None:
        from apps.artifacts.models import Replica, ReplicaState

        # Both the books and the node must agree: a replica recorded present, and the live check below.
        if not Replica.objects.filter(
            artifact_id=server.artifact_id, node=node, state=ReplicaState.PRESENT
        ).exists():
            server.fail(
                codes.MODEL_NOT_PRESENT_ON_NODE,
                f"Artifact {server.model!r} has no present replica on node {node.name}. "
                "Replicate the model to that node first.",
            )
            return
    try:
        presence = agent_client.model_presence(node, server.model)
        if presence.status != 200:
            server.fail(
                codes.LAUNCH_FAILED,
                f"The agent refused the presence check ({presence.status}): "
                f"{presence.body.get('message', '')}",
            )
            return
        if not presence.body.get("present"):
            server.fail(
                codes.MODEL_NOT_PRESENT_ON_NODE,
                f"Model {server.model!r} is not on node {node.name}. Replicate the model to that node first.",
            )
            return
        gpu_indexes = sorted(
            Reservation.objects.filter(server=server, gpu__isnull=False).values_list("gpu__index", flat=True)
        )
        reply = agent_client.call_agent(
            node,
            "POST",
            "/v1/servers",
            {
                "server_id": str(server.pk),
                "model": server.model,
                "command": profile.launch.command,
                "args": list(profile.launch.args),
                "env": profile.launch.env,
                "health_path": profile.launch.health_path,
                "values": {
                    "model": server.model,
                    "gpu_indexes": ",".join(str(i) for i in gpu_indexes),
                    "gpu_count": str(max(len(gpu_indexes), 1)),
                },
            },
        )
    except ApiError as exc:
        server.fail(exc.code, exc.message)
        return
    if reply.status != 200:
        code = reply.body.get("code") or codes.LAUNCH_FAILED
        server.fail(code, reply.body.get("message") or f"the agent answered {reply.status}")
        return
    ModelServer.objects.filter(pk=server.pk).update(pid=reply.body.get("pid"), port=reply.body.get("port"))


def check_start(server: ModelServer, started_at: datetime) -> bool:
    """One look at a starting server; True when it is settled (running or failed)."""
    try:
        assert server.node is not None
        reply = agent_client.call_agent(
            server.node, "POST", "/v1/servers/status", {"server_id": str(server.pk)}
        )
    except ApiError as exc:
        server.fail(exc.code, exc.message)
        return True
    state = reply.body.get("state")
    if state == "running":
        server.transition(
            ServerState.RUNNING,
            detail=f"healthy on port {reply.body.get('port')}",
            pid=reply.body.get("pid"),
            port=reply.body.get("port"),
        )
        return True
    if state == "failed" or reply.status != 200:
        server.fail(
            codes.LAUNCH_FAILED, reply.body.get("reason") or reply.body.get("message") or "launch failed"
        )
        return True
    if (timezone.now() - started_at).total_seconds() > settings.SERVER_START_TIMEOUT:
        server.fail(codes.LAUNCH_FAILED, f"not running within {settings.SERVER_START_TIMEOUT} s")
        stop_on_agent(server)
        return True
    return False


def stop_on_agent(server: ModelServer) -> dict[str, Any]:
    try:
        assert server.node is not None
        reply = agent_client.call_agent(
            server.node, "POST", "/v1/servers/stop", {"server_id": str(server.pk)}
        )
    except ApiError as exc:
        return {"ok": False, "code": exc.code, "message": exc.message}
    return {"ok": reply.status in (200, 404), "status": reply.status}


def reconcile_node(node: Node) -> tuple[int, int]:
    """Compare the books with what the node's agent actually runs, both ways.

    1. A server ``running`` in the books that the agent no longer runs (the agent restarted, the
       process died) is failed: ``PROCESS_LOST``.
    2. A process the agent runs that the books do not hold as live (failed while its node was offline,
       stopped, unknown) is stopped: an orphan would hold memory nobody accounts for.
    Returns (servers failed, orphans stopped).
    """
    try:
        reply = agent_client.call_agent(node, "GET", "/v1/servers")
    except ApiError:
        return 0, 0  # unreachable: liveness (and the sweep) decide, not one failed call
    reported = {str(s.get("server_id")): s for s in reply.body.get("servers", []) if isinstance(s, dict)}
    live_states = [ServerState.STARTING, ServerState.RUNNING, ServerState.STOPPING]
    books = {
        str(server.pk): server
        for server in ModelServer.objects.filter(node=node, state__in=live_states).select_related("node")
    }
    failed = 0
    for server_id, server in books.items():
        seen = reported.get(server_id)
        if server.state != ServerState.RUNNING or (seen is not None and seen.get("state") == "running"):
            continue
        reason = (seen or {}).get("reason") or (
            "the node's agent does not run this server any more (the agent restarted, or the process is gone)"
        )
        try:
            server.fail(codes.PROCESS_LOST, f"{reason}; place it again")
        except ApiError:
            continue  # it changed state meanwhile (a stop): the newer transition stands
        failed += 1
    orphans = 0
    for server_id, seen in reported.items():
        if server_id in books or seen.get("state") not in ("starting", "running"):
            continue
        try:
            agent_client.call_agent(node, "POST", "/v1/servers/stop", {"server_id": server_id})
        except ApiError:
            continue
        orphans += 1
        logger.warning(
            "stopped orphan server %s on node %s: the books do not hold it as live", server_id, node
        )
    return failed, orphans


_MARK_OFFLINE = f"""
WITH lost AS (
    UPDATE {ModelServer._meta.db_table} AS s
    SET state = 'failed', failure_code = %(code)s, failure_message = %(message)s, stopped_at = %(now)s
    FROM (SELECT id, state FROM {ModelServer._meta.db_table}
          WHERE node_id = ANY(%(nodes)s) AND state = ANY(%(live)s) FOR UPDATE) AS before
    WHERE s.id = before.id
    RETURNING s.id, before.state AS was
), events AS (
    INSERT INTO {ServerEvent._meta.db_table} (server_id, from_state, to_state, at, detail)
    SELECT id, was, 'failed', %(now)s, %(message)s FROM lost
), released AS (
    DELETE FROM {Reservation._meta.db_table} r USING lost WHERE r.server_id = lost.id
)
SELECT count(*) FROM lost
"""  # noqa: S608


@receiver(nodes_went_offline)
def mark_servers_of_offline_nodes(sender: Any, nodes: list[tuple[str, str]], at: datetime, **_: Any) -> int:
    """A server whose node went offline is marked so, not silently kept running in the books."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _MARK_OFFLINE,
            {
                "code": codes.NODE_OFFLINE,
                "message": "its node went offline; whether the process still runs is unknown",
                "now": at,
                "nodes": [node_id for node_id, _ in nodes],
                "live": [ServerState.STARTING, ServerState.RUNNING, ServerState.STOPPING],
            },
        )
        (count,) = cursor.fetchone()
    if count:
        logger.warning("%s server(s) marked failed: their node went offline", count)
        server_state_changed.send(sender=ModelServer, server_id=None)
    return int(count)
