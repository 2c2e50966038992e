"""Thin Celery wrappers over the nodes domain."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from apps.nodes import agent_client, liveness
from apps.nodes.models import Node
from modelforge.errors import ApiError


@shared_task(name="nodes.sweep_liveness")
def sweep_liveness() -> dict[str, int]:
    result = liveness.sweep()
    return {"stale": len(result.stale), "offline": len(result.offline)}


@shared_task(name="nodes.ping_node")
def ping_node(node_id: str) -> dict[str, Any]:
    """A signed ping: proves the agent is reachable and shares the cluster secret (recorded on the node)."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return {"ok": False, "code": "NOT_FOUND"}
    try:
        reply = agent_client.ping(node)
    except ApiError as exc:
        return {"ok": False, "code": exc.code, "message": exc.message}
    return {"ok": reply.status == 200, "status": reply.status}


@shared_task(name="nodes.ping_online_nodes")
def ping_online_nodes() -> int:
    """Ping every assignable node, so a secret mismatch shows up before the first real call."""
    ids = list(Node.objects.assignable().values_list("pk", flat=True))
    for node_id in ids:
        ping_node.delay(str(node_id))
    return len(ids)
