"""Restoring a verified backup, in recorded phases, with the switch-over last.

1. ``pre_checks``: the backup is still verified, its files still match the manifest, the tools match the
   server, and this code knows every migration the backup has.
2. ``restore``: a new database (``<service>_restore_<id>``) gets the dump; the database in service is
   not touched.
3. ``verification``: the invariants and row counts against the manifest; older schemas are migrated
   forward to this release.
4. ``switch_over``: the backup catalogue (backups and restores, which describe the backup root, not the
   restored state) is carried into the new database; then both databases are renamed in ONE
   transaction: the old one is kept as ``<service>_pre_restore_<id>``. The measured RPO is taken here.
5. ``post_checks``: the service database answers with the restored installation and no migration due.

Each phase is a row written as it starts and as it ends. A restore whose process dies is found by
``sweep_interrupted`` (its liveness lock is free) and becomes ``failed`` / ``RESTORE_FAILED`` awaiting
review; nothing resumes it. Only an operator's ``acknowledge`` or ``abandon`` (who and why recorded)
ends the review.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections, transaction
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone
from psycopg import sql

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.backups import codes, pgtools, snapshot, verification
from apps.backups.models import (
    BACKUP_ACTIVE,
    Backup,
    Restore,
    RestorePhase,
    RestorePhaseName,
    RestoreState,
    ReviewDecision,
)
from apps.nodes import listening
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)

CATALOGUE_TABLES = ("backups_backup", "backups_backupevent", "backups_restore", "backups_restorephase")
BASE_DIR = Path(settings.BASE_DIR)


def lock_key(restore_id: int) -> int:
    return pgtools.RESTORE_LOCK_BASE + restore_id


# --- requesting and reviewing ------------------------------------------------------------------------------


def refuse_point_in_time() -> ApiError:
    return ApiError(
        codes.NOT_SUPPORTED,
        "Point-in-time recovery is not supported in v1: restore a verified snapshot (its measured RPO is "
        "reported). Continuous WAL recovery is deliberately out of scope.",
        400,
    )


def request_restore(backup: Backup, *, by: str, reason: str) -> Restore:
    """Queue a restore of ``backup`` by an operator, refusing what must not start."""
    if not reason.strip():
        raise ApiError("VALIDATION_ERROR", "reason: say why this database is being restored.", 400)
    with transaction.atomic():
        Backup.objects.select_for_update().filter(pk=backup.pk).first()
        backup.refresh_from_db()
        if not backup.restore_eligible:
            raise ApiError(
                codes.BACKUP_NOT_RESTORE_ELIGIBLE,
                f"Backup #{backup.pk} is {backup.state}; only a verified backup can be restored.",
                409,
            )
        awaiting = Restore.objects.filter(needs_review=True).first()
        if awaiting is not None:
            raise ApiError(
                codes.RESTORE_FAILED,
                f"Restore #{awaiting.pk} stopped during {awaiting.phase or 'start-up'} and awaits review: "
                "acknowledge or abandon it (docs/operations/RUNBOOK_DATABASE_RESTORE.md) before another.",
                409,
            )
        active = Restore.objects.filter(state__in=(RestoreState.QUEUED, RestoreState.RUNNING)).first()
        if active is not None:
            raise ApiError(codes.RESTORE_IN_PROGRESS, f"Restore #{active.pk} is {active.state}.", 409)
        running = Backup.objects.filter(state__in=BACKUP_ACTIVE).first()
        if running is not None:
            raise ApiError(
                codes.BACKUP_IN_PROGRESS, f"Backup #{running.pk} is {running.state}; restore after it.", 409
            )
        return Restore.objects.create(backup=backup, requested_by=by, reason=reason.strip())


def review(restore: Restore, *, decision: str, by: str, note: str) -> Restore:
    """The operator's review of a failed restore: ``acknowledge`` (the outcome stands) or ``abandon``
    (its left-over database is dropped). Either way who, when and why are recorded."""
    if decision not in ReviewDecision.values:
        raise ApiError("VALIDATION_ERROR", f"decision: one of {', '.join(ReviewDecision.values)}.", 400)
    if not note.strip():
        raise ApiError("VALIDATION_ERROR", "reason: say why, for the record.", 400)
    if not restore.needs_review:
        raise ApiError(
            codes.RESTORE_NOT_REVIEWABLE,
            f"Restore #{restore.pk} is {restore.state} and awaits no review.",
            409,
        )
    server = pgtools.service_server()
    with server.maintenance() as conn:
        if pgtools.is_alive(conn, lock_key(restore.pk)):
            raise ApiError(codes.RESTORE_IN_PROGRESS, f"Restore #{restore.pk} is still running.", 409)
    leftover = (
        restore.target_database and not restore.switched_over and restore.target_database != server.database
    )
    if decision == ReviewDecision.ABANDON and leftover:
        pgtools.drop_database(server, restore.target_database)
    Restore.objects.filter(pk=restore.pk).update(
        needs_review=False,
        review_decision=decision,
        reviewed_by=by,
        reviewed_at=timezone.now(),
        review_note=note.strip(),
    )
    Alert.objects.clear_for([codes.RESTORE_FAILED], "restore", str(restore.pk))
    restore.refresh_from_db()
    return restore


def sweep_interrupted() -> int:
    """A ``running`` restore whose process is gone becomes ``RESTORE_FAILED`` awaiting review."""
    running = list(Restore.objects.filter(state=RestoreState.RUNNING))
    swept = 0
    if not running:
        return 0
    with pgtools.service_server().maintenance() as conn:
        for restore in running:
            if pgtools.is_alive(conn, lock_key(restore.pk)):
                continue
            message = f"the restore's process died during {restore.phase or 'start-up'}; it is not resumed"
            with transaction.atomic():
                try:
                    restore.transition(
                        RestoreState.FAILED,
                        detail=message,
                        failure_code=codes.RESTORE_FAILED,
                        failure_message=message,
                        needs_review=True,
                        finished_at=timezone.now(),
                    )
                except ApiError:
                    continue  # it moved on meanwhile
                restore.phases.filter(finished_at__isnull=True).update(
                    finished_at=timezone.now(), outcome="interrupted", detail=message
                )
            _raise_alert(restore, message)
            swept += 1
    return swept


def _raise_alert(restore: Restore, message: str) -> None:
    Alert.objects.raise_alert(
        codes.RESTORE_FAILED,
        Severity.CRITICAL,
        "restore",
        str(restore.pk),
        f"restore #{restore.pk}",
        f"Restore #{restore.pk} of backup #{restore.backup_id} failed: {message}. It needs operator review.",
    )


# --- running ------------------------------------------------------------------------------------------------


class PhaseFailed(Exception):
    pass


@contextmanager
def _phase(restore: Restore, name: str) -> Iterator[dict[str, Any]]:
    """Record a phase as it starts and as it ends; ``detail`` collects what it wants to say."""
    row = RestorePhase.objects.create(restore=restore, name=name)
    Restore.objects.filter(pk=restore.pk).update(phase=name)
    restore.phase = name
    detail: dict[str, Any] = {}
    try:
        yield detail
    except Exception as exc:
        _drop_pooled_connections()  # the failure may have left our pooled connections terminated
        RestorePhase.objects.filter(pk=row.pk).update(
            finished_at=timezone.now(), outcome="failed", detail=str(exc)[:4000]
        )
        raise
    RestorePhase.objects.filter(pk=row.pk).update(
        finished_at=timezone.now(), outcome="ok", detail=detail.get("text", "")
    )


def run(restore_id: int) -> str:
    """Run a queued restore through its phases; returns its final state."""
    server = pgtools.service_server()
    sweep_interrupted()
    try:
        with pgtools.liveness_lock(server, lock_key(restore_id)):
            restore = (
                Restore.objects.select_related("backup")
                .filter(pk=restore_id, state=RestoreState.QUEUED)
                .first()
            )
            if restore is None:
                return "skipped"
            try:
                restore.transition(RestoreState.RUNNING, started_at=timezone.now())
            except ApiError:
                return "skipped"  # another worker claimed it first
            try:
                _run_phases(server, restore)
            except Exception as exc:
                logger.exception("restore #%s failed during %s", restore_id, restore.phase)
                _drop_pooled_connections()
                message = f"{restore.phase}: {exc}"[:4000]
                if restore.target_database and not restore.switched_over:
                    pgtools.drop_database(server, restore.target_database)
                restore.transition(
                    RestoreState.FAILED,
                    detail=message,
                    failure_code=codes.RESTORE_FAILED,
                    failure_message=message,
                    needs_review=True,
                    finished_at=timezone.now(),
                )
                _raise_alert(restore, message)
            restore.refresh_from_db()
            return restore.state
    except pgtools.LockHeld:
        return "skipped"


def _run_phases(server: pgtools.Server, restore: Restore) -> None:
    backup = restore.backup
    directory = Path(backup.directory)
    target = f"{server.database}_restore_{restore.pk}"[:63]
    previous = f"{server.database}_pre_restore_{restore.pk}"[:63]

    with _phase(restore, RestorePhaseName.PRE_CHECKS) as detail:
        if not backup.restore_eligible:
            raise PhaseFailed(f"backup #{backup.pk} is {backup.state}, not verified")
        manifest = snapshot.read_manifest(directory)
        try:
            verification.check_files(directory, manifest, backup.files)
        except verification.VerificationFailed as failure:
            raise PhaseFailed(f"the backup's files changed since verification: {failure.message}") from None
        assert manifest is not None
        with server.maintenance() as conn:
            if pgtools.tool_major("pg_restore") != pgtools.server_major(conn):
                raise PhaseFailed("pg_restore's major differs from the server's (MODELFORGE_PG_BIN_DIR)")
        unknown = sorted(set(manifest.get("migrations") or []) - _known_migrations())
        if unknown:
            raise PhaseFailed(f"the backup has migrations this release does not know: {', '.join(unknown)}")
        for name in (target, previous):
            if pgtools.database_exists(server, name):
                raise PhaseFailed(f"database {name} already exists; drop or rename it first")
        detail["text"] = (
            f"backup #{backup.pk} verified, digests match, consistent as of {backup.consistent_as_of}"
        )

    with _phase(restore, RestorePhaseName.RESTORE) as detail:
        Restore.objects.filter(pk=restore.pk).update(target_database=target)
        restore.target_database = target
        pgtools.create_database(server, target)
        snapshot.test_pause("restore_restoring")
        pgtools.pg_restore(server, directory / snapshot.DUMP_FILE, target)
        detail["text"] = f"restored into {target}"

    with _phase(restore, RestorePhaseName.VERIFICATION) as detail:
        with server.connect(target) as conn:
            try:
                checked = verification.check_database(conn, manifest)
            except verification.VerificationFailed as failure:
                raise PhaseFailed(f"{failure.step}: {failure.message}") from None
        migrated = _migrate_forward(server, target)
        snapshot.test_pause("restore_verified")
        detail["text"] = (
            f"{checked['invariants']} invariants hold, {checked['tables_counted']} tables' rows match"
        )
        if migrated:
            detail["text"] += "; migrated forward to this release"

    with _phase(restore, RestorePhaseName.SWITCH_OVER) as detail:
        Restore.objects.filter(pk=restore.pk).update(previous_database=previous)
        restore.previous_database = previous
        _carry_catalogue(server, target)
        snapshot.test_pause("before_switch")
        switched_at = _switch(server, target, previous)
        consistent_as_of = backup.consistent_as_of
        assert consistent_as_of is not None
        rpo = (switched_at - consistent_as_of).total_seconds()
        Restore.objects.filter(pk=restore.pk).update(
            switched_over=True, rpo_seconds=rpo, consistent_as_of=consistent_as_of
        )
        restore.switched_over = True
        # The restored books' heartbeats are as old as the backup: nothing was listening in between, so
        # every node starts a full grace period from the switch-over (apps.nodes.listening).
        listening.resumed(f"restore {restore.pk} switched the database over", switched_at)
        detail["text"] = (
            f"{target} is now {server.database}; the replaced database is kept as {previous}; "
            f"RPO {rpo:.1f} s (changes after {consistent_as_of.isoformat()} are not in the restored state)"
        )

    with _phase(restore, RestorePhaseName.POST_CHECKS) as detail:
        snapshot.test_pause("restore_post_checks")
        with server.connect() as conn:
            try:
                verification.check_invariants(conn)
            except verification.VerificationFailed as failure:
                raise PhaseFailed(f"{failure.step}: {failure.message}") from None
            _, applied = snapshot.read_schema_revision(conn)
        missing = _known_migrations() - set(applied)
        if missing:
            raise PhaseFailed(f"the service database lacks migrations: {', '.join(sorted(missing))}")
        if not Restore.objects.filter(pk=restore.pk, switched_over=True).exists():
            raise PhaseFailed("the service database does not hold this restore's record")
        detail["text"] = "the service database answers; invariants hold; no migration due"
    restore.transition(RestoreState.COMPLETED, finished_at=timezone.now(), phase="")


def _known_migrations() -> set[str]:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return {f"{app}.{name}" for app, name in loader.disk_migrations}


def _migrate_forward(server: pgtools.Server, database: str) -> bool:
    """Apply this release's newer migrations to the restored database (a child process on it)."""
    with server.connect(database) as conn:
        _, applied = snapshot.read_schema_revision(conn)
    if set(applied) >= _known_migrations():
        return False
    password = f":{server.password}" if server.password else ""
    env = dict(os.environ)
    env["MODELFORGE_DATABASE_URL"] = (
        f"postgres://{server.user}{password}@{server.host}:{server.port}/{database}"
    )
    done = subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), "migrate", "--no-input"],
        env=env,
        capture_output=True,
        text=True,
        cwd=BASE_DIR,
    )
    if done.returncode != 0:
        raise PhaseFailed(f"migrating the restored database failed: {done.stderr[-2000:]}")
    return True


def _carry_catalogue(server: pgtools.Server, target: str) -> None:
    """Copy the backup catalogue into the restored database: it describes the backup root (files that
    exist now, restores that happened), not the state being restored."""
    with server.connect() as source, server.connect(target, autocommit=False) as sink:
        sink.execute(
            sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                sql.SQL(", ").join(map(sql.Identifier, CATALOGUE_TABLES))
            )
        )
        for table in CATALOGUE_TABLES:
            ident = sql.Identifier(table)
            copy_out = sql.SQL("COPY {} TO STDOUT (FORMAT binary)").format(ident)
            copy_in = sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(ident)
            with source.cursor().copy(copy_out) as out, sink.cursor().copy(copy_in) as into:
                for data in out:
                    into.write(data)
            sink.execute(
                sql.SQL(
                    "SELECT setval(pg_get_serial_sequence({t}, 'id'), GREATEST((SELECT max(id) FROM {i}), 1))"
                ).format(t=sql.Literal(table), i=ident)
            )
        sink.commit()


def _switch(server: pgtools.Server, target: str, previous: str) -> datetime:
    """Rename the service database away and the restored one into its place, in one transaction.

    Sessions on either database are terminated first (PostgreSQL refuses to rename a database in use);
    a client that reconnects in between only makes us try again. Nothing changes unless both renames
    commit together.
    """
    _drop_pooled_connections()
    with server.maintenance() as conn:
        for _attempt in range(100):
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
                [[server.database, target]],
            )
            try:
                with conn.transaction():
                    conn.execute(
                        sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                            sql.Identifier(server.database), sql.Identifier(previous)
                        )
                    )
                    conn.execute(
                        sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                            sql.Identifier(target), sql.Identifier(server.database)
                        )
                    )
                    row = conn.execute("SELECT clock_timestamp()").fetchone()
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.05)
        else:
            raise PhaseFailed(
                "sessions kept reconnecting to the service database; the switch-over did not happen"
            )
    _drop_pooled_connections()
    assert row is not None
    switched_at: datetime = row[0]
    return switched_at


def _drop_pooled_connections() -> None:
    """Close every connection and pool of this process: after a switch-over (or a failed one) the
    sessions they held may be terminated; the next query opens fresh ones."""
    for conn in connections.all(initialized_only=True):
        conn.close()
        close_pool = getattr(conn, "close_pool", None)
        if close_pool is not None:
            close_pool()
