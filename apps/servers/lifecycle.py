"""Remote starts and stops through the node's agent, and what happens when a node goes away.

Every call to an agent is signed (``apps.nodes.agent_client``) and runs in a Celery task.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.dispatch import receiver
from django.utils import timezone

from apps.nodes import agent_client
from apps.nodes import codes as node_codes
from apps.nodes.models import Node, NodeEvent
from apps.nodes.signals import nodes_went_offline
from apps.servers import codes
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer, Reservation, ServerEvent, ServerTombstone
from apps.servers.profiles import runtime_profiles
from apps.servers.signals import server_state_changed
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)


def launch(server: ModelServer) -> None:
    """Step one of a remote start: ask the node whether the model is present, then launch.

    Refused outright, each with its key: ``model_not_present_on_node`` ("Replicate the model to that
    node first."). The local-node-only keys are decided at placement, before anything is reserved.
    """
    node = server.node
    assert node is not None
    profile = runtime_profiles().get(server.profile)
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
                "ready_check": profile.launch.ready_check,
                "values": {
                    "model": server.model,
                    "gpu_indexes": ",".join(str(i) for i in gpu_indexes),
                    "gpu_count": str(max(len(gpu_indexes), 1)),
                },
                # Echoed back by the agent's listing: what books restored from an older backup need to
                # re-record a server they never saw (reconcile_node).
                "meta": {
                    "name": server.name,
                    "profile": server.profile,
                    # Which engine's metrics the agent reads for the heartbeat (agent/engine_signals.py).
                    "engine": profile.engine,
                    "gpus": gpu_indexes,
                    "memory_per_unit_bytes": server.memory_per_unit_bytes,
                    "memory_rule": server.memory_rule,
                    "weights_bytes": server.weights_bytes,
                    "encrypted": server.encrypted,
                    "artifact": str(server.artifact_id) if server.artifact_id else None,
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


@dataclass
class Reconciled:
    """What one reconcile of a node changed."""

    failed: int = 0
    adopted: int = 0
    recorded: int = 0
    stopped: int = 0


def reconcile_node(node: Node) -> Reconciled:
    """Compare the books with what the node's agent actually runs, both ways.

    The agent is the truth of what runs; the books are the truth of what should run.

    1. A server ``running`` in the books that the agent no longer runs (the agent restarted, the
       process died) is failed: ``PROCESS_LOST`` (its restart policy may bring it back).
    2. A process the agent runs whose server the books hold as failed for a liveness reason (its node
       was offline, or the process was not found then) is adopted back: ``running``, with an event.
    3. A process whose server the books do not have at all (restored from an older backup) is
       re-recorded from the agent's report, with an event; never stopped.
    4. A process is stopped only when an operator asked for it: its server stopped, or deleted (a
       tombstone says by whom), or placed again elsewhere and running there (the old copy goes once
       the replacement runs). Each stop is an event with who and when.
    """
    try:
        reply = agent_client.call_agent(node, "GET", "/v1/servers")
    except ApiError:
        return Reconciled()  # unreachable: liveness (and the sweep) decide, not one failed call
    reported = {str(s.get("server_id")): s for s in reply.body.get("servers", []) if isinstance(s, dict)}
    done = Reconciled()
    for server in ModelServer.objects.filter(node=node, state=ServerState.RUNNING).select_related("node"):
        seen = reported.get(str(server.pk))
        if seen is not None and seen.get("state") == "running":
            continue
        reason = (seen or {}).get("reason") or (
            "the node's agent does not run this server any more (the agent restarted, or the process is gone)"
        )
        try:
            server.fail(codes.PROCESS_LOST, reason)
        except ApiError:
            continue  # it changed state meanwhile (a stop): the newer transition stands
        done.failed += 1
    running_here = {
        sid: seen for sid, seen in reported.items() if seen.get("state") in ("starting", "running")
    }
    if not running_here:
        return done
    books = {
        str(s.pk): s for s in ModelServer.objects.filter(pk__in=_uuids(running_here)).select_related("node")
    }
    tombstones = {
        str(t.server_id): t for t in ServerTombstone.objects.filter(server_id__in=_uuids(running_here))
    }
    for server_id, seen in running_here.items():
        found = books.get(server_id)
        tombstone = tombstones.get(server_id)
        if tombstone is not None:
            why = f"deleted by {tombstone.deleted_by} at {tombstone.deleted_at.isoformat(timespec='seconds')}"
            if _stop_copy(node, server_id, why):
                tombstone.delete()
                done.stopped += 1
            continue
        if found is None:
            done.recorded += _re_record(node, server_id, seen)
            continue
        server = found
        if server.node_id != node.pk:
            if server.state == ServerState.RUNNING:
                # Only once the other node's agent itself says it runs the replacement: books restored
                # from before a re-placement name the old node, where nothing may run any more.
                there = _reported_state(server.node, server_id) if server.node else None
                if there == "running":
                    why = f"placed again on {server.node.name if server.node else '?'}, where it runs now"
                    if _stop_copy(node, server_id, why, server):
                        done.stopped += 1
                elif there is not None:
                    done.adopted += _re_point(server, node, seen, there)
            elif server.state == ServerState.FAILED and seen.get("state") == "running":
                done.adopted += _adopt(server, node, seen, "its replacement did not run")
            continue  # the replacement is starting: the old copy serves until it runs
        if server.state in (ServerState.STOPPED, ServerState.STOPPING):
            if server.state == ServerState.STOPPED:
                stop_event = server.events.filter(to_state=ServerState.STOPPING).first()
                why = stop_event.detail if stop_event else "its server is stopped"
                if _stop_copy(node, server_id, why, server):
                    done.stopped += 1
            continue  # stopping: the stop task is on it
        if server.state == ServerState.FAILED and seen.get("state") == "running":
            if server.failure_code in ADOPTABLE:
                done.adopted += _adopt(server, node, seen, f"it was failed {server.failure_code}")
            elif server.failure_code in STOP_INTENDED and _stop_copy(
                node, server_id, STOP_INTENDED[server.failure_code], server
            ):
                done.stopped += 1
    return done


# Failures that say nothing about the process itself: the control plane could not see it.
ADOPTABLE = (codes.NODE_OFFLINE, codes.PROCESS_LOST, node_codes.AGENT_UNREACHABLE)
# Failures that are a decision to stop it: the control plane gave up its start, or an operator marked it
# failed (apps.core.work); its process is stopped when its agent reports it.
STOP_INTENDED = {
    codes.LAUNCH_FAILED: "its start was given up (LAUNCH_FAILED): the control plane asked for the stop",
    "WORK_CANCELLED": "an operator marked it failed (WORK_CANCELLED)",
}


def _uuids(ids: Any) -> list[uuid.UUID]:
    out = []
    for value in ids:
        try:
            out.append(uuid.UUID(str(value)))
        except ValueError:
            continue
    return out


def _adopt(server: ModelServer, node: Node, seen: dict[str, Any], why: str) -> int:
    try:
        server.transition(
            ServerState.RUNNING,
            detail=f"adopted: the agent of {node.name} reports it running ({why})",
            node_id=node.pk,
            pid=seen.get("pid"),
            port=seen.get("port"),
            failure_code="",
            failure_message="",
            restart_attempts=0,
        )
    except ApiError:
        return 0
    logger.warning("adopted server %s on node %s: its agent reports it running", server.name, node.name)
    return 1


def _reported_state(node: Node, server_id: str) -> str | None:
    """What ``node``'s agent says of ``server_id`` ("running", "failed", "unknown" ...), or None when the
    agent cannot be asked (then nothing is decided on its account)."""
    try:
        reply = agent_client.call_agent(node, "POST", "/v1/servers/status", {"server_id": server_id})
    except ApiError:
        return None
    if reply.status == 404:
        return "unknown"
    if reply.status != 200:
        return None
    return str(reply.body.get("state") or "unknown")


def _re_point(server: ModelServer, node: Node, seen: dict[str, Any], there: str) -> int:
    """The books say the server runs on another node, whose agent does not run it; this node's does."""
    old = server.node.name if server.node else "?"
    moved = ModelServer.objects.filter(pk=server.pk, state=ServerState.RUNNING, node=server.node).update(
        node_id=node.pk, port=seen.get("port"), pid=seen.get("pid")
    )
    if not moved:
        return 0
    ServerEvent.objects.create(
        server=server,
        from_state=server.state,
        to_state=server.state,
        detail=(
            f"adopted on {node.name}: the books named {old}, whose agent reports it {there}; "
            f"the agent of {node.name} runs it"
        )[:500],
    )
    server_state_changed.send(sender=ModelServer, server_id=server.pk)
    logger.warning("server %s re-pointed from %s to %s: that is where it runs", server.name, old, node.name)
    return 1


def _stop_copy(node: Node, server_id: str, why: str, server: ModelServer | None = None) -> bool:
    try:
        reply = agent_client.call_agent(node, "POST", "/v1/servers/stop", {"server_id": server_id})
    except ApiError:
        return False
    if reply.status not in (200, 404):
        return False
    detail = f"the copy on {node.name} stopped: {why}"
    if server is not None:
        ServerEvent.objects.create(
            server=server, from_state=server.state, to_state=server.state, detail=detail[:500]
        )
    logger.warning("stopped server %s on node %s: %s", server_id, node.name, why)
    return True


def _re_record(node: Node, server_id: str, seen: dict[str, Any]) -> int:
    """Books restored from an older backup: record the server the agent runs from its own report."""
    meta: dict[str, Any] = seen["meta"] if isinstance(seen.get("meta"), dict) else {}
    name = str(meta.get("name") or f"recovered-{server_id[:8]}")[:63]
    if ModelServer.objects.filter(name=name).exists():
        name = f"{name[:50]}-{server_id[:8]}"
    profile = str(meta.get("profile") or "")[:63]
    gpus = [g for g in meta.get("gpus") or [] if isinstance(g, int)]
    need = meta["memory_per_unit_bytes"] if isinstance(meta.get("memory_per_unit_bytes"), int) else 0
    try:
        with transaction.atomic():
            server = ModelServer.objects.create(
                id=uuid.UUID(server_id),
                name=name,
                profile=profile,
                model=str(seen.get("model") or meta.get("model") or "")[:255],
                weights_bytes=meta.get("weights_bytes")
                if isinstance(meta.get("weights_bytes"), int)
                else None,
                gpus_wanted=len(gpus),
                encrypted=bool(meta.get("encrypted")),
                node=node,
                memory_per_unit_bytes=need,
                memory_rule=str(meta.get("memory_rule") or "")[:200],
                state=ServerState.RUNNING if seen.get("state") == "running" else ServerState.STARTING,
                port=seen.get("port"),
                pid=seen.get("pid"),
                running_at=timezone.now() if seen.get("state") == "running" else None,
            )
            units = {g.index: g for g in node.gpus.filter(index__in=gpus)}
            Reservation.objects.bulk_create(
                [
                    Reservation(server=server, node=node, gpu=units.get(i), bytes=need)
                    for i in gpus
                    if i in units
                ]
                or (
                    [Reservation(server=server, node=node, gpu=None, bytes=need)] if need and not gpus else []
                )
            )
            ServerEvent.objects.create(
                server=server,
                from_state="",
                to_state=server.state,
                detail=(
                    f"re-recorded from the agent of {node.name}: it runs this server, which the books did "
                    "not hold (restored from an older backup?); attach it to its cluster again if it "
                    "belonged to one"
                )[:500],
            )
    except (ValueError, IntegrityError) as exc:
        logger.error("could not re-record server %s reported by %s: %s", server_id, node.name, exc)
        return 0
    if server.state == ServerState.STARTING:
        from apps.servers.tasks import watch_start

        send_on_commit(watch_start, server_id, timezone.now().isoformat(), countdown=1)
    logger.warning("re-recorded server %s (%s) from the agent of %s", name, server_id, node.name)
    server_state_changed.send(sender=ModelServer, server_id=server.pk)
    return 1


# The states the offline sweep fails in one statement, around ModelServer.transition() (a set-based sweep,
# listed in apps/core/tests/test_state_writes.py): each may become failed by TRANSITIONS.
OFFLINE_SWEPT = (ServerState.STARTING, ServerState.RUNNING, ServerState.STOPPING)

_MARK_OFFLINE = f"""
WITH lost AS (
    UPDATE {ModelServer._meta.db_table} AS s
    SET state = 'failed', failure_code = %(code)s, failure_message = %(message)s, stopped_at = %(now)s
    FROM (SELECT s.id, s.state FROM {ModelServer._meta.db_table} AS s
          JOIN unnest({{nodes}}) AS gone(id) ON s.node_id = gone.id
          WHERE s.state = ANY(%(live)s) FOR UPDATE OF s) AS before
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
# The nodes: listed (their ids in one array literal), or named by the fleet's event row of a transition
# that moved many at once (its ``nodes`` column, uuid[] already: no text to parse per id).
_MARK_LISTED = _MARK_OFFLINE.format(nodes="%(nodes)s::uuid[]")
_MARK_FLEET = _MARK_OFFLINE.format(
    nodes=f"(SELECT nodes FROM {NodeEvent._meta.db_table} WHERE id = %(event)s)::uuid[]"  # noqa: S608
)


@receiver(nodes_went_offline)
def mark_servers_of_offline_nodes(
    sender: Any, nodes: list[tuple[str, str]], at: datetime, event: int | None = None, **_: Any
) -> int:
    """A server whose node went offline is marked so, not silently kept running in the books. ``event``:
    the fleet's event row naming ``nodes`` all, when they went offline many at once."""
    params: dict[str, Any] = {
        "code": codes.NODE_OFFLINE,
        "message": "its node went offline; whether the process still runs is unknown",
        "now": at,
        "live": list(OFFLINE_SWEPT),
    }
    if event is not None:
        statement, params["event"] = _MARK_FLEET, event
    else:
        # One array literal: a list of ids would cost the driver microseconds per id and PostgreSQL one
        # parsed constant each.
        statement, params["nodes"] = _MARK_LISTED, "{" + ",".join(str(node_id) for node_id, _ in nodes) + "}"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)
        (count,) = cursor.fetchone()
    if count:
        logger.warning("%s server(s) marked failed: their node went offline", count)
        server_state_changed.send(sender=ModelServer, server_id=None)
    return int(count)
