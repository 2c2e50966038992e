"""Model servers' waiting work (``apps.core.work``): starting or stopping past its bound. Registered at
``ServersConfig.ready()``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import OuterRef, Subquery

from apps.core.work import WORK_CANCELLED, Kind, Waiting, bound, moved_on
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer, ServerEvent
from modelforge.dispatch import send
from modelforge.errors import ApiError


def _servers() -> Iterable[Waiting]:
    entered = ServerEvent.objects.filter(server=OuterRef("pk"), to_state=OuterRef("state")).order_by(
        "-at", "-id"
    )
    rows = ModelServer.objects.filter(state__in=(ServerState.STARTING, ServerState.STOPPING)).annotate(
        entered_at=Subquery(entered.values("at")[:1])
    )
    for server in rows.select_related("node"):
        since = server.entered_at or server.created_at
        if server.state == ServerState.STARTING:
            yield Waiting(
                "server",
                str(server.pk),
                server.name,
                server.state,
                "its agent to report it running",
                since,
                bound("WORK_RESEND_AFTER"),
                bound("SERVER_START_TIMEOUT") + bound("WORK_STUCK_AFTER"),
                server,
            )
        else:
            yield Waiting(
                "server",
                str(server.pk),
                server.name,
                server.state,
                "its agent to stop it",
                since,
                bound("WORK_RESEND_AFTER"),
                bound("WORK_STUCK_AFTER"),
                server,
            )


def _resend_server(server: Any) -> None:
    from apps.servers.tasks import start_server, stop_server

    if server.state == ServerState.STOPPING:
        send(stop_server, str(server.pk))
    elif server.pid is None:
        send(start_server, str(server.pk))  # the agent's launch is idempotent per server id


def _look_at_server(item: Waiting, now: datetime) -> None:
    """A server starting for longer than the re-send bound, with a process launched, is looked at from
    here with its agent's answer: running, still starting, or failed past the start timeout with its
    reservation released (the watch chain that should have done it may be gone). No second chain."""
    from apps.servers import lifecycle

    server = item.row
    if (
        item.state == ServerState.STARTING
        and server.pid is not None
        and server.node is not None
        and item.age(now) > item.resend_after
    ):
        lifecycle.check_start(server, item.since)


def _fail_server(server: Any, by: str) -> None:
    """Failed on the operator's word: never restarted by the policy, and a process its agent still runs
    for it is stopped by reconcile (apps.servers.lifecycle)."""
    try:
        server.fail(WORK_CANCELLED, f"marked failed by {by} while {server.state}")
    except ApiError:
        raise moved_on("server", server.pk) from None


KINDS = (
    Kind(
        "server", "Model servers", 30, _servers, retry=_resend_server, fail=_fail_server, look=_look_at_server
    ),
)
