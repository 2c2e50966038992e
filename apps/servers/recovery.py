"""Failed servers come back: the restart policy's sweep, and the ``SERVER_FAILED`` alerts.

The operator's actions (restart, re-place, delete: apps.servers.services) and the restart policy's
automatic ones place through the same ``place_again``, and placement is always ``scheduler.place`` with
its rules and refusals: a server placed again keeps its identity (its clusters and capabilities still
name it), and a server nothing has room for stays failed with the refusal in its ``SERVER_FAILED`` alert.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.servers import codes
from apps.servers.choices import RestartPolicy, ServerState
from apps.servers.models import ModelServer, ServerTombstone
from apps.servers.scheduler import Request, place
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)

# Failures a restart may cure: the process died, the node went away, the start did not come up.
RESTARTABLE = (codes.PROCESS_LOST, codes.NODE_OFFLINE, codes.LAUNCH_FAILED, "AGENT_UNREACHABLE")
# A server that ran this long before failing starts its back-off again from the first step.
HEALTHY_RUN_S = 600
# Tombstones are dropped once their copy is stopped, or after this many days.
TOMBSTONE_DAYS = 30


def refuse_unless_failed(server: ModelServer, action: str) -> None:
    if server.state != ServerState.FAILED:
        raise ApiError(
            codes.INVALID_SERVER_STATE,
            f"Server {server.name} is {server.state}; only a failed server can be {action}.",
            409,
        )


def place_again(server: ModelServer, *, node: str | None, why: str, reset: bool = False) -> ModelServer:
    with transaction.atomic():
        server = (
            ModelServer.objects.select_for_update(of=("self",)).select_related("artifact").get(pk=server.pk)
        )
        refuse_unless_failed(server, "placed again")
        if reset and server.restart_attempts:
            ModelServer.objects.filter(pk=server.pk).update(restart_attempts=0)
            server.restart_attempts = 0
        return place(
            Request(
                name=server.name,
                profile=server.profile,
                model=server.model,
                gpus=server.gpus_wanted,
                weights_bytes=server.weights_bytes,
                encrypted=server.encrypted,
                node=node,
                artifact=server.artifact,
                existing=server,
                why=why,
            )
        )


def backoff_s(attempts: int) -> int:
    """Doubling from ``SERVER_RESTART_BACKOFF``, capped at ``SERVER_RESTART_BACKOFF_MAX``."""
    return int(
        min(settings.SERVER_RESTART_BACKOFF * 2 ** min(attempts, 20), settings.SERVER_RESTART_BACKOFF_MAX)
    )


def next_restart_at(server: ModelServer) -> datetime | None:
    """When the restart policy tries again, or None when it will not (policy, attempts, failure kind)."""
    if (
        server.state != ServerState.FAILED
        or server.restart_policy != RestartPolicy.ON_FAILURE
        or server.failure_code not in RESTARTABLE
        or server.restart_attempts >= settings.SERVER_RESTART_MAX_ATTEMPTS
    ):
        return None
    failed_at = server.stopped_at or server.created_at
    return failed_at + timedelta(seconds=backoff_s(server.restart_attempts))


def recover(now: datetime | None = None) -> dict[str, int]:
    """The restart policy, then the ``SERVER_FAILED`` alerts (one per failed server, cleared when it runs
    again or is deleted)."""
    now = now or timezone.now()
    restarted = refused = 0
    for server in ModelServer.objects.filter(
        state=ServerState.FAILED,
        restart_policy=RestartPolicy.ON_FAILURE,
        failure_code__in=RESTARTABLE,
    ).select_related("node"):
        if (
            server.running_at
            and server.stopped_at
            and (server.stopped_at - server.running_at).total_seconds() > HEALTHY_RUN_S
            and server.restart_attempts
        ):
            ModelServer.objects.filter(pk=server.pk).update(restart_attempts=0)
            server.restart_attempts = 0
        due = next_restart_at(server)
        if due is None or due > now:
            continue
        attempt = server.restart_attempts + 1
        # The attempt ends the run judged above (as a placement does): kept, a refused attempt's
        # ``stopped_at`` (now) less the old ``running_at`` would read as a healthy run at the next sweep and
        # reset the count, so refusals never used the attempts up (issue 48: six left it at 1).
        ModelServer.objects.filter(pk=server.pk, state=ServerState.FAILED).update(
            restart_attempts=attempt, stopped_at=now, running_at=None
        )
        same_node = server.node is not None and server.node.is_assignable(now)
        why = (
            f"automatic restart {attempt} of {settings.SERVER_RESTART_MAX_ATTEMPTS} "
            f"after {server.failure_code}"
        )
        try:
            place_again(
                server,
                node=server.node.name if same_node and server.node else None,
                why=why if same_node else f"{why}: its node is not available, placed again elsewhere",
            )
        except ApiError as exc:
            refused += 1
            ModelServer.objects.filter(pk=server.pk, state=ServerState.FAILED).update(
                failure_message=f"{server.failure_message.split(' | restart refused: ')[0]}"
                f" | restart refused: {exc.code}: {exc.message}"[:2000]
            )
            logger.warning("restart of %s refused: %s %s", server.name, exc.code, exc.message)
            continue
        restarted += 1
    raise_failed_alerts(now)
    # A tombstone whose node never came back in a month is not worth keeping for ever.
    ServerTombstone.objects.filter(deleted_at__lt=now - timedelta(days=TOMBSTONE_DAYS)).delete()
    return {"restarted": restarted, "refused": refused}


def raise_failed_alerts(now: datetime | None = None) -> None:
    now = now or timezone.now()
    failed = list(ModelServer.objects.filter(state=ServerState.FAILED).select_related("node"))
    for server in failed:
        due = next_restart_at(server)
        if due is not None:
            plan = (
                f"Restart {server.restart_attempts + 1} of {settings.SERVER_RESTART_MAX_ATTEMPTS} at "
                f"{timezone.localtime(due):%H:%M:%S}."
            )
        elif server.restart_policy == RestartPolicy.NEVER:
            plan = "Its restart policy is never: restart, re-place or delete it."
        elif server.failure_code not in RESTARTABLE:
            plan = "This failure is not restarted automatically: fix the cause, then restart or re-place it."
        else:
            plan = (
                f"Automatic restarts are exhausted ({server.restart_attempts}): "
                "restart, re-place or delete it."
            )
        Alert.objects.raise_alert(
            codes.ALERT_SERVER_FAILED,
            Severity.WARNING,
            "server",
            str(server.pk),
            server.name,
            f"Server {server.name} failed on {server.node.name if server.node else 'no node'} "
            f"({server.failure_code}: {server.failure_message}). {plan}"[:2000],
            at=now,
        )
    failed_ids = {str(server.pk) for server in failed}
    stale = (
        Alert.objects.open()
        .filter(code=codes.ALERT_SERVER_FAILED)
        .exclude(subject_id__in=failed_ids)
        .values_list("dedup_key", flat=True)
    )
    Alert.objects.clear(list(stale), at=now)
