"""Thin Celery wrappers over model-server lifecycle steps."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.utils import timezone

from apps.servers import codes, lifecycle
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer

WATCH_EVERY_S = 1.0


@shared_task(name="servers.start_server")
def start_server(server_id: str) -> str:
    server = ModelServer.objects.select_related("node").filter(pk=server_id).first()
    if server is None or server.state != ServerState.STARTING:
        return "skipped"
    lifecycle.launch(server)
    server.refresh_from_db()
    if server.state == ServerState.STARTING:
        watch_start.apply_async((server_id, timezone.now().isoformat()), countdown=WATCH_EVERY_S)
    return server.state


@shared_task(name="servers.watch_start")
def watch_start(server_id: str, started_at: str) -> str:
    """Look once; re-enqueue itself until the server is running or failed (never blocks a worker)."""
    server = ModelServer.objects.select_related("node").filter(pk=server_id).first()
    if server is None or server.state != ServerState.STARTING:
        return "settled"
    if not lifecycle.check_start(server, datetime.fromisoformat(started_at)):
        watch_start.apply_async((server_id, started_at), countdown=WATCH_EVERY_S)
        return "starting"
    return server.state


@shared_task(name="servers.stop_server")
def stop_server(server_id: str) -> str:
    server = ModelServer.objects.select_related("node").filter(pk=server_id).first()
    if server is None or server.state != ServerState.STOPPING:
        return "skipped"
    result = lifecycle.stop_on_agent(server)
    if result["ok"]:
        server.transition(ServerState.STOPPED, detail="stopped by its agent")
    else:
        server.fail(
            result.get("code", codes.STOP_FAILED), result.get("message", "the agent could not stop it")
        )
    return server.state


@shared_task(name="servers.reconcile")
def reconcile() -> dict[str, int]:
    """Every online node (enabled or not) that has ever run a server: do its agent and the books agree?"""
    from apps.nodes.choices import Liveness
    from apps.nodes.models import Node

    nodes = Node.objects.filter(liveness=Liveness.ONLINE, servers__isnull=False).distinct()
    failed = orphans = 0
    for node in nodes:
        lost, stopped = lifecycle.reconcile_node(node)
        failed, orphans = failed + lost, orphans + stopped
    return {"failed": failed, "orphans_stopped": orphans}
