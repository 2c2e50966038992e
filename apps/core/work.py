"""Work is never stranded: every state that waits on something has a bound.

Each kind of waiting row is described once (``KINDS``): which rows wait, since when, how to send their
task again (idempotent: every task claims its row first) and how an operator marks one failed. The
``core.watch_work`` beat task (``MODELFORGE_WORK_WATCH_INTERVAL``) walks them:

1. a row that waited past ``resend_after`` has its task sent again: a message lost to a broker outage,
   or a task chain broken by a killed worker, costs a delay, never the work;
2. a copying replica and a starting server whose watch went quiet are looked at from here, with the
   agent's own report (no message in the broker needed to finish them);
3. a row that waited past ``stuck_after`` raises ``WORK_STUCK`` (warning) naming the row, what it waits
   on, since when, and the way out (retry, or mark failed: API ``/api/v1/system/work``, the admin, the
   dashboard's Work page); it clears when the row moves on.

A row whose worker died under an advisory lock (backups, restores, acquisitions) is recognised at once
by its free lock; the others by time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from modelforge.dispatch import send
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)

WORK_STUCK = "WORK_STUCK"
WORK_NOT_WAITING = "WORK_NOT_WAITING"
WORK_KIND_UNKNOWN = "WORK_KIND_UNKNOWN"
WORK_CANCELLED = "WORK_CANCELLED"


@dataclass(frozen=True)
class Waiting:
    """One row waiting on background work, as the watchdog and the operator see it."""

    kind: str
    id: str
    name: str
    state: str
    waits_on: str
    since: datetime
    resend_after: int
    stuck_after: int
    row: Any

    def age(self, now: datetime) -> float:
        return (now - self.since).total_seconds()

    def as_dict(self, now: datetime) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "waits_on": self.waits_on,
            "since": self.since,
            "age_seconds": round(self.age(now), 1),
            "stuck_after_seconds": self.stuck_after,
            "stuck": self.age(now) > self.stuck_after,
        }


@dataclass(frozen=True)
class Kind:
    name: str
    label: str
    waiting: Callable[[], Iterable[Waiting]]
    resend: Callable[[Any], None]
    fail: Callable[[Any, str], None]


def _bound(name: str) -> int:
    return int(getattr(settings, name))


# --- backups and restores ------------------------------------------------------------------------------


def _backups() -> Iterable[Waiting]:
    from apps.backups.models import Backup, BackupState

    for backup in Backup.objects.filter(state__in=(BackupState.QUEUED, BackupState.COMPLETED)):
        if backup.state == BackupState.QUEUED:
            yield Waiting(
                "backup",
                str(backup.pk),
                f"backup #{backup.pk}",
                backup.state,
                "a worker to take it",
                backup.requested_at,
                _bound("WORK_RESEND_AFTER"),
                _bound("WORK_STUCK_AFTER"),
                backup,
            )
        else:
            yield Waiting(
                "backup",
                str(backup.pk),
                f"backup #{backup.pk}",
                backup.state,
                "a worker to verify it",
                backup.finished_at or backup.requested_at,
                _bound("WORK_RESEND_AFTER"),
                _bound("WORK_STUCK_AFTER") + _bound("WORK_LONG_TASK_BOUND"),
                backup,
            )


def _resend_backup(backup: Any) -> None:
    from apps.backups.models import BackupState
    from apps.backups.tasks import take_backup, verify_backup

    send(take_backup if backup.state == BackupState.QUEUED else verify_backup, backup.pk)


def _fail_backup(backup: Any, by: str) -> None:
    message = f"marked failed by {by} while {backup.state}"
    try:
        backup.transition(
            "failed",
            detail=message,
            reason_code=WORK_CANCELLED,
            reason_message=message,
            finished_at=timezone.now(),
        )
    except ApiError:
        raise _moved_on("backup", backup.pk) from None


def _restores() -> Iterable[Waiting]:
    from apps.backups.models import Restore, RestoreState

    for restore in Restore.objects.filter(state=RestoreState.QUEUED):
        yield Waiting(
            "restore",
            str(restore.pk),
            f"restore #{restore.pk}",
            restore.state,
            "a worker to run it",
            restore.requested_at,
            _bound("WORK_RESEND_AFTER"),
            _bound("WORK_STUCK_AFTER"),
            restore,
        )


def _resend_restore(restore: Any) -> None:
    from apps.backups.tasks import run_restore

    send(run_restore, restore.pk)


def _fail_restore(restore: Any, by: str) -> None:
    try:
        restore.transition(
            "failed",
            detail=f"cancelled by {by} before it started",
            by=by,
            failure_code=WORK_CANCELLED,
            failure_message=f"cancelled by {by} before it started; the service database was not touched",
            finished_at=timezone.now(),
        )
    except ApiError:
        raise _moved_on("restore", restore.pk) from None


# --- model servers --------------------------------------------------------------------------------------


def _servers() -> Iterable[Waiting]:
    from apps.servers.choices import ServerState
    from apps.servers.models import ModelServer, ServerEvent

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
                _bound("WORK_RESEND_AFTER"),
                _bound("SERVER_START_TIMEOUT") + _bound("WORK_STUCK_AFTER"),
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
                _bound("WORK_RESEND_AFTER"),
                _bound("WORK_STUCK_AFTER"),
                server,
            )


def _resend_server(server: Any) -> None:
    from apps.servers.choices import ServerState
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
    from apps.servers.choices import ServerState

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
        raise _moved_on("server", server.pk) from None


# --- artifacts and replicas -----------------------------------------------------------------------------


def _artifacts() -> Iterable[Waiting]:
    from apps.artifacts.models import Artifact, ArtifactEvent, ArtifactState

    entered = ArtifactEvent.objects.filter(artifact=OuterRef("pk"), to_state=OuterRef("state")).order_by(
        "-at", "-id"
    )
    rows = Artifact.objects.filter(state__in=(ArtifactState.REQUESTED, ArtifactState.ACQUIRING)).annotate(
        entered_at=Subquery(entered.values("at")[:1])
    )
    for artifact in rows:
        since = artifact.entered_at or artifact.created_at
        if artifact.state == ArtifactState.REQUESTED:
            yield Waiting(
                "artifact",
                str(artifact.pk),
                artifact.name,
                artifact.state,
                "a worker to acquire it",
                since,
                _bound("WORK_RESEND_AFTER"),
                _bound("WORK_STUCK_AFTER"),
                artifact,
            )
        else:
            yield Waiting(
                "artifact",
                str(artifact.pk),
                artifact.name,
                artifact.state,
                "its acquisition to finish",
                since,
                10**9,
                _acquiring_bound(artifact),
                artifact,
            )


def _acquiring_bound(artifact: Any) -> int:
    """An acquisition whose worker died (its advisory lock free) is stuck now; a live one gets the long
    bound."""
    from apps.artifacts import locks

    return _bound("WORK_LONG_TASK_BOUND") if locks.is_acquiring(artifact.pk) else 0


def _resend_artifact(artifact: Any) -> None:
    from apps.artifacts.models import ArtifactState
    from apps.artifacts.tasks import acquire

    if artifact.state == ArtifactState.REQUESTED:
        send(acquire, artifact.pk)


def _retry_artifact(artifact: Any) -> None:
    """Retry: a dead acquisition goes back to requested (its partial store folder is replaced)."""
    from apps.artifacts.models import ArtifactState

    if artifact.state == ArtifactState.ACQUIRING:
        from apps.artifacts import locks

        if locks.is_acquiring(artifact.pk):
            raise ApiError(WORK_NOT_WAITING, f"Artifact {artifact.name} is being acquired right now.", 409)
        try:
            artifact.transition(
                ArtifactState.REQUESTED, detail="requested again: the process acquiring it is gone"
            )
        except ApiError:
            raise _moved_on("artifact", artifact.pk) from None
    _resend_artifact(artifact)


def _fail_artifact(artifact: Any, by: str) -> None:
    from apps.artifacts.models import Artifact, ArtifactState

    fresh = Artifact.objects.get(pk=artifact.pk)
    if fresh.state not in (ArtifactState.REQUESTED, ArtifactState.ACQUIRING):
        raise _moved_on("artifact", artifact.pk)
    try:
        fresh.transition(
            ArtifactState.FAILED,
            detail=f"marked failed by {by} while {fresh.state}",
            failure_code=WORK_CANCELLED,
            failure_message=f"marked failed by {by} while {fresh.state}; retry to acquire it again",
        )
    except ApiError:
        raise _moved_on("artifact", artifact.pk) from None


def _replicas() -> Iterable[Waiting]:
    from apps.artifacts.models import Replica, ReplicaState

    for replica in Replica.objects.filter(
        state__in=(ReplicaState.REQUESTED, ReplicaState.COPYING)
    ).select_related("artifact", "node"):
        waits_on = (
            "a worker to start the copy" if replica.state == ReplicaState.REQUESTED else "the node's copy"
        )
        since = replica.progress_at if replica.state == ReplicaState.COPYING else replica.updated_at
        yield Waiting(
            "replica",
            str(replica.pk),
            f"{replica.artifact.name} on {replica.node.name}",
            replica.state,
            waits_on,
            since or replica.requested_at,
            _bound("WORK_RESEND_AFTER"),
            _bound("WORK_STUCK_AFTER"),
            replica,
        )


def _resend_replica(replica: Any) -> None:
    from apps.artifacts.models import ReplicaState
    from apps.artifacts.tasks import replicate

    if replica.state == ReplicaState.REQUESTED:
        send(replicate, replica.pk)


def _look_at_replica(item: Waiting, now: datetime) -> None:
    """A copying replica whose watch went quiet is looked at here: the agent's own report finishes it."""
    from apps.artifacts import replication
    from apps.artifacts.models import ReplicaState

    replica = item.row
    if replica.state == ReplicaState.COPYING and (now - replica.updated_at).total_seconds() > WATCH_QUIET_S:
        replication.check(replica)


def _retry_replica(replica: Any) -> None:
    from apps.artifacts import replication
    from apps.artifacts.models import ReplicaState

    if replica.state == ReplicaState.COPYING:
        replication.check(replica)  # the agent's report first: it may be done already
        replica.refresh_from_db()
        if replica.state == ReplicaState.COPYING:
            replication.start(replica)  # the agent resumes its copy where it stopped
            replica.refresh_from_db()
    _resend_replica(replica)


def _fail_replica(replica: Any, by: str) -> None:
    reason = f"{WORK_CANCELLED}: marked failed by {by} while {replica.state}"
    try:
        replica.transition("failed", detail=reason, by=by, reason=reason, updated_at=timezone.now())
    except ApiError:
        raise _moved_on("replica", replica.pk) from None


# A watch chain that re-enqueues itself every second is quiet for this long only if it is gone.
WATCH_QUIET_S = 15

KINDS: dict[str, Kind] = {
    "backup": Kind("backup", "Backups", _backups, _resend_backup, _fail_backup),
    "restore": Kind("restore", "Restores", _restores, _resend_restore, _fail_restore),
    "server": Kind("server", "Model servers", _servers, _resend_server, _fail_server),
    "artifact": Kind("artifact", "Artifacts", _artifacts, _retry_artifact, _fail_artifact),
    "replica": Kind("replica", "Replicas", _replicas, _retry_replica, _fail_replica),
}
LOOKS: dict[str, Callable[[Waiting, datetime], None]] = {
    "server": _look_at_server,
    "replica": _look_at_replica,
}
RESENDS: dict[str, Callable[[Any], None]] = {"artifact": _resend_artifact, "replica": _resend_replica}


def _moved_on(kind: str, pk: Any) -> ApiError:
    return ApiError(WORK_NOT_WAITING, f"The {kind} {pk} is not waiting any more; nothing was changed.", 409)


def waiting(now: datetime | None = None) -> list[Waiting]:
    """Every row waiting on background work, oldest first."""
    rows = [item for kind in KINDS.values() for item in kind.waiting()]
    return sorted(rows, key=lambda item: item.since)


def watch(now: datetime | None = None) -> dict[str, int]:
    """One pass of the watchdog: look, re-send, raise and clear ``WORK_STUCK``."""
    now = now or timezone.now()
    resent = looked = 0
    for item in waiting(now):
        look = LOOKS.get(item.kind)
        if look is not None:
            try:
                look(item, now)
                looked += 1
            except Exception:
                logger.exception("watchdog could not look at %s %s", item.kind, item.id)
        if item.age(now) > item.resend_after:
            (RESENDS.get(item.kind) or KINDS[item.kind].resend)(item.row)
            resent += 1
    stuck = [item for item in waiting(now) if item.age(now) > item.stuck_after]
    for item in stuck:
        Alert.objects.raise_alert(
            WORK_STUCK,
            Severity.WARNING,
            item.kind,
            item.id,
            item.name,
            f"{item.name[:1].upper()}{item.name[1:]} has been {item.state} since "
            f"{timezone.localtime(item.since):%Y-%m-%d %H:%M:%S %Z}, waiting for {item.waits_on} "
            f"(bound {item.stuck_after} s). Its task is re-sent while it waits; retry it or mark it failed "
            f"(dashboard Work, the admin, or POST /api/v1/system/work/{item.kind}/{item.id}/retry|fail).",
            at=now,
        )
    keep = {(item.kind, item.id) for item in stuck}
    cleared = [
        alert.dedup_key
        for alert in Alert.objects.open().filter(code=WORK_STUCK)
        if (alert.subject_type, alert.subject_id) not in keep
    ]
    Alert.objects.clear(cleared, at=now)
    return {"resent": resent, "looked": looked, "stuck": len(stuck)}


def find(kind: str, pk: str) -> Waiting:
    if kind not in KINDS:
        raise ApiError(
            WORK_KIND_UNKNOWN, f"No kind of work is called {kind!r}; use one of {', '.join(KINDS)}.", 404
        )
    for item in KINDS[kind].waiting():
        if item.id == str(pk):
            return item
    raise _moved_on(kind, pk)


def retry(kind: str, pk: str, by: str) -> Waiting:
    """Send the row's task again (or look, for a copying replica); the row as it is afterwards."""
    item = find(kind, pk)
    KINDS[kind].resend(item.row)
    logger.warning("%s %s: retry requested by %s", kind, pk, by)
    try:
        return find(kind, pk)
    except ApiError:
        return item  # it moved on at once (a replica found present)


def fail(kind: str, pk: str, by: str) -> None:
    item = find(kind, pk)
    KINDS[kind].fail(item.row, by)
    Alert.objects.clear_for([WORK_STUCK], kind, str(pk))
    logger.warning("%s %s: marked failed by %s", kind, pk, by)


def past_bound_count(now: datetime | None = None) -> int:
    now = now or timezone.now()
    return sum(1 for item in waiting(now) if item.age(now) > item.stuck_after)
