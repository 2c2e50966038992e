"""Thin Celery wrappers over model-server lifecycle steps."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.utils import timezone

from apps.servers import codes, lifecycle
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer
from modelforge.dispatch import send

WATCH_EVERY_S = 1.0


@shared_task(name="servers.start_server")
def start_server(server_id: str) -> str:
    server = ModelServer.objects.select_related("node").filter(pk=server_id).first()
    if server is None or server.state != ServerState.STARTING:
        return "skipped"
    lifecycle.launch(server)
    server.refresh_from_db()
    if server.state == ServerState.STARTING:
        send(watch_start, server_id, timezone.now().isoformat(), countdown=WATCH_EVERY_S)
    return server.state


@shared_task(name="servers.watch_start")
def watch_start(server_id: str, started_at: str) -> str:
    """Look once; re-enqueue itself until the server is running or failed (never blocks a worker)."""
    server = ModelServer.objects.select_related("node").filter(pk=server_id).first()
    if server is None or server.state != ServerState.STARTING:
        return "settled"
    if not lifecycle.check_start(server, datetime.fromisoformat(started_at)):
        send(watch_start, server_id, started_at, countdown=WATCH_EVERY_S)
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
    """Every online node (enabled or not): do its agent and the books agree?"""
    from apps.nodes.choices import Liveness
    from apps.nodes.models import Node

    # Every online node: one whose books are empty (restored from an older backup) may still run servers.
    totals = {"failed": 0, "adopted": 0, "recorded": 0, "stopped": 0}
    # Online now: not the nodes held in the fleet's stale state (models.liveness_now), silent as they are.
    for node in Node.objects.in_liveness(Liveness.ONLINE):
        done = lifecycle.reconcile_node(node)
        for key in totals:
            totals[key] += getattr(done, key)
    return totals


@shared_task(name="servers.recover")
def recover() -> dict[str, int]:
    """The restart policy of failed servers, and their SERVER_FAILED alerts."""
    from apps.servers import recovery

    return recovery.recover()
