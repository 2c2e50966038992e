"""What an operator may do to a model server, written once: the API, the dashboard and the admin call
these functions (and nothing else that changes a server), so each surface refuses the same way with the
same code, status and message (an ``ApiError``), and renders it its own way.

Placing a new server is ``PlaceRequestSerializer.place`` (the scheduler's request is validated there) for
the API and the dashboard alike; the admin does not place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from apps.alerts.models import Alert
from apps.servers import codes, recovery
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer, ServerTombstone
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)


def operator_name(user: Any) -> str:
    """Who asked, as event rows and tombstones record it: the user's name (a staff session), or the
    principal's text (the operator API key has no user)."""
    return str(getattr(user, "username", None) or user)


def stop(server: ModelServer, by: str) -> None:
    """Stop a starting or running server (``INVALID_SERVER_STATE``, 409, from any other state): the agent
    is asked to stop the process, and the stop task finishes the transition."""
    server.request_stop(by=by)


def stop_each(servers: Iterable[ModelServer], by: str) -> int:
    """Stop each of ``servers`` that may be stopped now; the others are left as they are. How many were
    asked to stop."""
    stopped = 0
    for server in servers:
        try:
            stop(server, by)
        except ApiError:
            continue
        stopped += 1
    return stopped


def set_restart_policy(server: ModelServer, policy: str) -> bool:
    """Whether the restart policy brings ``server`` back after a failure; ``True`` if it changed
    (``VALIDATION_ERROR``, 400, for a policy that is not one)."""
    return server.set_restart_policy(policy)


def restart(server: ModelServer, by: str) -> ModelServer:
    """Start a failed server again on its own node (headroom is checked there again). An operator's
    restart gives the restart policy its attempts back."""
    recovery.refuse_unless_failed(server, "restarted")
    if server.node is None:
        raise ApiError(codes.INVALID_SERVER_STATE, f"Server {server.name} has no node; re-place it.", 409)
    return recovery.place_again(server, node=server.node.name, why=f"restart requested by {by}", reset=True)


def replace(server: ModelServer, by: str) -> ModelServer:
    """Place a failed server again wherever the scheduler finds room (its old node included)."""
    recovery.refuse_unless_failed(server, "re-placed")
    return recovery.place_again(server, node=None, why=f"re-place requested by {by}", reset=True)


def delete(server: ModelServer, by: str) -> None:
    """Delete a failed or stopped server. A failed one may still run where the control plane cannot see
    (its node offline): a tombstone makes reconcile stop that copy when the node reports it."""
    if server.state not in (ServerState.FAILED, ServerState.STOPPED):
        raise ApiError(
            codes.INVALID_SERVER_STATE,
            f"Server {server.name} is {server.state}; stop it before deleting it.",
            409,
        )
    with transaction.atomic():
        locked = ModelServer.objects.select_for_update(of=("self",)).filter(pk=server.pk).first()
        if locked is None:
            return  # deleted meanwhile
        if locked.state not in (ServerState.FAILED, ServerState.STOPPED):
            raise ApiError(
                codes.INVALID_SERVER_STATE,
                f"Server {server.name} became {locked.state} meanwhile; stop it before deleting it.",
                409,
            )
        if locked.state == ServerState.FAILED:
            ServerTombstone.objects.update_or_create(
                server_id=server.pk,
                defaults={"name": server.name, "node_id": server.node_id, "deleted_by": by[:150]},
            )
        Alert.objects.clear_for([codes.ALERT_SERVER_FAILED], "server", str(server.pk))
        server.delete()
    logger.warning("server %s deleted by %s", server.name, by)
