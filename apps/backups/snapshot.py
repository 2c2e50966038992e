"""Taking a backup: a pg_dump snapshot in its own directory, a manifest written last, fail closed.

A backup, step by step (``take``):

1. Take the backup's liveness lock, then claim it (``queued`` -> ``running``, compare-and-swap): a
   redelivered task finds it claimed and does nothing, and a sweeper that can take the lock knows the
   backup's process is dead (``sweep_interrupted``: ``failed`` / ``MANIFEST_INCOMPLETE``).
2. Check the destination: the backup root exists, is writable and has room; the backup's own directory
   is created. Any of these failing is ``DESTINATION_UNAVAILABLE`` and nothing is left behind.
3. Export a snapshot from a repeatable-read transaction; pg_dump dumps exactly that snapshot while the
   same transaction counts the key tables' rows and reads the schema revision, so the manifest describes
   the dump, and its ``consistent_as_of`` is the snapshot's time.
4. Hash the dump; write ``manifest.json`` last (temporary name, fsync, rename): a directory without a
   manifest is never a recovery point.
5. ``completed``; verification follows (``verification.verify``) and only it makes a backup eligible.

Every failure removes the backup's directory: a failed backup leaves a record, never files to mistake
for a recovery point.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import signal
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from django.apps import apps as django_apps
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.backups import codes, pgtools
from apps.backups.models import BACKUP_ACTIVE, Backup, BackupState
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)

DUMP_FILE = "database.dump"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
# The apps whose tables are the platform's authoritative state (counted in the manifest, checked on
# verification). Celery beat's schedule copy and sessions are not.
AUTHORITATIVE_APPS = ("auth", "core", "alerts", "nodes", "servers", "clusters", "artifacts", "backups")
# Refuse a destination with less room than this (or than the last backup's size, if larger).
MINIMUM_FREE_BYTES = 1 << 20
_DESTINATION_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EDQUOT}
_DESTINATION_WORDS = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota")
INSTALLATION_SUBJECT = ("installation", "installation", "this installation")


class BackupFailure(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def test_pause(point: str) -> None:
    """Stop this process at ``point`` so that a test can kill it there (never in production).

    The kill tests set ``MODELFORGE_TEST_PAUSE_AT``; the process stops itself (SIGSTOP) and the test
    delivers a real SIGKILL at exactly this point.
    """
    if os.environ.get("MODELFORGE_TEST_PAUSE_AT") == point and not settings.PRODUCTION:
        os.kill(os.getpid(), signal.SIGSTOP)


# --- requesting -----------------------------------------------------------------------------------------


def request_backup(*, trigger: str, by: str) -> Backup:
    """Queue a backup; one at a time (``409 BACKUP_IN_PROGRESS`` names the one running)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Two operators pressing the button at once queue one backup, not two.
            cursor.execute("SELECT pg_advisory_xact_lock(%s, 0)", [pgtools.lock_namespace()])
        from apps.backups.models import Restore, RestoreState

        restoring = Restore.objects.filter(state__in=(RestoreState.QUEUED, RestoreState.RUNNING)).first()
        if restoring is not None:
            raise ApiError(
                codes.RESTORE_IN_PROGRESS,
                f"Restore #{restoring.pk} is {restoring.state}; back up after it.",
                409,
            )
        active = Backup.objects.filter(state__in=BACKUP_ACTIVE).first()
        if active is not None:
            raise ApiError(
                codes.BACKUP_IN_PROGRESS,
                f"Backup #{active.pk} is {active.state}; wait for it to finish, then ask again.",
                409,
            )
        return Backup.objects.create(trigger=trigger, requested_by=by)


# --- taking ---------------------------------------------------------------------------------------------


def take(backup_id: int) -> str:
    """Run the queued backup ``backup_id`` to ``completed`` or ``failed``; returns the state."""
    server = pgtools.service_server()
    sweep_interrupted()
    try:
        with pgtools.liveness_lock(server, backup_id):
            backup = Backup.objects.filter(pk=backup_id, state=BackupState.QUEUED).first()
            if backup is None:
                return "skipped"
            try:
                backup.transition(BackupState.RUNNING, started_at=timezone.now(), phase="destination")
            except ApiError:
                return "skipped"  # another worker claimed it first
            directory: Path | None = None
            try:
                directory = _prepare_destination(backup)
                _dump(server, backup, directory)
            except BackupFailure as failure:
                _fail(backup, directory, failure.code, failure.message)
            except Exception as exc:
                logger.exception("backup #%s failed", backup_id)
                _fail(backup, directory, codes.DUMP_FAILED, f"{type(exc).__name__}: {exc}")
            return backup.state
    except pgtools.LockHeld:
        return "skipped"


def _prepare_destination(backup: Backup) -> Path:
    root = Path(settings.BACKUP_ROOT)
    if not root.is_dir():
        raise BackupFailure(
            codes.DESTINATION_UNAVAILABLE, f"the backup root {root} is missing (MODELFORGE_BACKUP_ROOT)"
        )
    previous = Backup.objects.filter(state=BackupState.VERIFIED).order_by("-id").first()
    needed = max(MINIMUM_FREE_BYTES, previous.size_bytes if previous else 0)
    free = shutil.disk_usage(root).free
    if free < needed:
        raise BackupFailure(
            codes.DESTINATION_UNAVAILABLE,
            f"the backup root {root} is full: {free} bytes free, at least {needed} needed",
        )
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    directory = root / f"{stamp}-{backup.pk}"
    try:
        directory.mkdir()
        probe = directory / ".probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise BackupFailure(
            codes.DESTINATION_UNAVAILABLE, f"the backup root {root} is not writable: {exc.strerror}"
        ) from exc
    backup.directory = str(directory)
    backup.save(update_fields=["directory"])
    return directory


def authoritative_tables() -> list[str]:
    tables = {
        model._meta.db_table
        for model in django_apps.get_models()
        if model._meta.app_label in AUTHORITATIVE_APPS and model._meta.managed and not model._meta.proxy
    }
    return sorted(tables)


def read_schema_revision(conn: psycopg.Connection[Any]) -> tuple[str, list[str]]:
    """The applied migrations (``app.name``) and their digest: the schema revision a manifest records."""
    rows = conn.execute("SELECT app, name FROM django_migrations ORDER BY app, name").fetchall()
    applied = [f"{app}.{name}" for app, name in rows]
    digest = hashlib.sha256("".join(f"{m}\n" for m in applied).encode()).hexdigest()
    return digest, applied


def count_rows(conn: psycopg.Connection[Any], tables: list[str]) -> dict[str, int]:
    from psycopg import sql

    counts: dict[str, int] = {}
    for table in tables:
        exists = conn.execute("SELECT to_regclass(%s)", [table]).fetchone()
        if not exists or exists[0] is None:
            continue
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
        counts[table] = int(row[0]) if row else 0
    return counts


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _dump(server: pgtools.Server, backup: Backup, directory: Path) -> None:
    snapshot_conn = server.connect(autocommit=False)
    try:
        snapshot_conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snapshot_conn.read_only = True
        row = snapshot_conn.execute(
            "SELECT pg_export_snapshot(), clock_timestamp(), current_setting('server_version')"
        ).fetchone()
        assert row is not None
        snapshot_id, consistent_as_of, server_version = row
        tools_major, server_major = pgtools.tool_major("pg_dump"), pgtools.server_major(snapshot_conn)
        if tools_major != server_major:
            raise BackupFailure(
                codes.PG_TOOLS_MISMATCH,
                f"pg_dump is PostgreSQL {tools_major} but the server is {server_major}; point "
                "MODELFORGE_PG_BIN_DIR at the server's own major",
            )
        Backup.objects.filter(pk=backup.pk).update(phase="dumping", consistent_as_of=consistent_as_of)
        test_pause("after_snapshot")
        dump_path = directory / DUMP_FILE
        child = pgtools.popen(
            [
                pgtools.tool("pg_dump"),
                "--format=custom",
                f"--snapshot={snapshot_id}",
                f"--file={dump_path}",
                "--no-sync",
                server.database,
            ],
            server.libpq_env(),
        )
        # While pg_dump works, the same snapshot gives the figures the manifest promises.
        schema_revision, migrations = read_schema_revision(snapshot_conn)
        row_counts = count_rows(snapshot_conn, authoritative_tables())
        _, err = child.communicate()
    finally:
        snapshot_conn.close()
    if child.returncode != 0:
        words = err.decode(errors="replace").strip()[-2000:]
        if child.returncode < 0:
            raise BackupFailure(
                codes.MANIFEST_INCOMPLETE,
                f"pg_dump was killed by signal {-child.returncode} before the dump was complete",
            )
        if any(w in words for w in _DESTINATION_WORDS):
            raise BackupFailure(codes.DESTINATION_UNAVAILABLE, f"writing the dump failed: {words}")
        raise BackupFailure(codes.DUMP_FAILED, f"pg_dump exited {child.returncode}: {words}")
    test_pause("after_dump")
    Backup.objects.filter(pk=backup.pk).update(phase="hashing")
    files = [{"name": DUMP_FILE, "size": dump_path.stat().st_size, "sha256": sha256_file(dump_path)}]
    test_pause("after_hash")
    finished_at = timezone.now()
    manifest = {
        "format": MANIFEST_FORMAT,
        "backup_id": backup.pk,
        "files": files,
        "database": {"name": server.database, "server_version": server_version},
        "schema_revision": schema_revision,
        "migrations": migrations,
        "modelforge_version": settings.RELEASE,
        "row_counts": row_counts,
        "started_at": backup.started_at.isoformat() if backup.started_at else None,
        "finished_at": finished_at.isoformat(),
        "consistent_as_of": consistent_as_of.isoformat(),
    }
    Backup.objects.filter(pk=backup.pk).update(phase="manifest")
    _write_manifest(directory, manifest)
    backup.refresh_from_db()
    backup.transition(
        BackupState.COMPLETED,
        detail=f"{files[0]['size']} bytes, consistent as of {consistent_as_of.isoformat()}",
        phase="",
        files=files,
        size_bytes=sum(int(str(f["size"])) for f in files),
        database_name=server.database,
        server_version=server_version,
        schema_revision=schema_revision,
        modelforge_version=settings.RELEASE,
        row_counts=row_counts,
        finished_at=finished_at,
        consistent_as_of=consistent_as_of,
    )


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    temporary = directory / (MANIFEST_FILE + ".tmp")
    try:
        with temporary.open("w") as handle:
            json.dump(manifest, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            test_pause("manifest_partial")
            os.fsync(handle.fileno())
        with (directory / DUMP_FILE).open("rb") as dump:
            os.fsync(dump.fileno())
        os.replace(temporary, directory / MANIFEST_FILE)
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as exc:
        if exc.errno in _DESTINATION_ERRNOS:
            raise BackupFailure(
                codes.DESTINATION_UNAVAILABLE, f"writing the manifest failed: {exc.strerror}"
            ) from exc
        raise


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _fail(backup: Backup, directory: Path | None, code: str, message: str) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
    backup.refresh_from_db()
    backup.transition(
        BackupState.FAILED,
        detail=f"{code}: {message}",
        phase="",
        reason_code=code,
        reason_message=message,
        finished_at=timezone.now(),
    )
    raise_failed_alert(backup)


def raise_failed_alert(backup: Backup) -> None:
    Alert.objects.raise_alert(
        codes.BACKUP_FAILED,
        Severity.CRITICAL,
        *INSTALLATION_SUBJECT,
        f"Backup #{backup.pk} failed ({backup.reason_code}): {backup.reason_message}",
    )


# --- sweeping, staleness, retention -----------------------------------------------------------------------


def sweep_interrupted() -> int:
    """Fail every ``running`` backup whose process is gone: ``MANIFEST_INCOMPLETE``, files removed."""
    running = list(Backup.objects.filter(state=BackupState.RUNNING))
    if not running:
        return 0
    swept = 0
    with pgtools.service_server().maintenance() as conn:
        for backup in running:
            if pgtools.is_alive(conn, backup.pk):
                continue
            interrupted = f"interrupted while {backup.phase or 'starting'}; never restore-eligible"
            with transaction.atomic():
                try:
                    backup.transition(
                        BackupState.FAILED,
                        detail=f"{codes.MANIFEST_INCOMPLETE}: the backup's process died while {backup.phase}",
                        phase="",
                        reason_code=codes.MANIFEST_INCOMPLETE,
                        reason_message=interrupted,
                        finished_at=timezone.now(),
                    )
                except ApiError:
                    continue  # it moved on meanwhile
            if backup.directory:
                shutil.rmtree(backup.directory, ignore_errors=True)
            backup.refresh_from_db()
            raise_failed_alert(backup)
            swept += 1
    return swept


def check_staleness(now: datetime | None = None) -> bool:
    """Raise ``BACKUP_STALE`` if the newest verified backup is older than the threshold; else clear it.

    A new installation is measured from when it was installed, not flagged on its first minute.
    Returns whether the alert is open.
    """
    from apps.core.models import Installation

    now = now or timezone.now()
    threshold = timedelta(seconds=settings.BACKUP_STALE_AFTER)
    newest = Backup.objects.newest_verified()
    reference = newest.consistent_as_of if newest and newest.consistent_as_of else None
    if reference is None:
        reference = Installation.objects.current().created_at
    if now - reference <= threshold:
        Alert.objects.clear_for([codes.BACKUP_STALE], INSTALLATION_SUBJECT[0], INSTALLATION_SUBJECT[1], now)
        return False
    if newest is None:
        message = "No verified backup exists. Take one, and find out why the schedule did not."
    else:
        hours = (now - reference).total_seconds() / 3600
        message = (
            f"The newest verified backup (#{newest.pk}) is {hours:.1f} h old, over the "
            f"{settings.BACKUP_STALE_AFTER / 3600:.1f} h threshold. Take one, and find out why the "
            "schedule did not."
        )
    Alert.objects.raise_alert(codes.BACKUP_STALE, Severity.WARNING, *INSTALLATION_SUBJECT, message, at=now)
    return True


def prune(now: datetime | None = None) -> list[int]:
    """Expire backups beyond retention: older than ``BACKUP_KEEP_DAYS`` *and* not among the newest
    ``BACKUP_KEEP``. The newest verified backup is never expired. Returns the expired ids."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.BACKUP_KEEP_DAYS)
    kept = Backup.objects.filter(state__in=(BackupState.VERIFIED, BackupState.COMPLETED))
    newest = kept.order_by("-id").values_list("id", flat=True)[: settings.BACKUP_KEEP]
    newest_verified = Backup.objects.newest_verified()
    expired = []
    for backup in kept.exclude(id__in=list(newest)).filter(requested_at__lt=cutoff):
        if newest_verified is not None and backup.pk == newest_verified.pk:
            continue
        if backup.directory:
            shutil.rmtree(backup.directory, ignore_errors=True)
        backup.transition(BackupState.EXPIRED, detail="removed by retention", expired_at=now)
        expired.append(backup.pk)
    # A backup that failed verification keeps its files for inspection, until retention's age.
    for backup in Backup.objects.filter(
        state=BackupState.FAILED, expired_at__isnull=True, requested_at__lt=cutoff
    ).exclude(directory=""):
        shutil.rmtree(backup.directory, ignore_errors=True)
        Backup.objects.filter(pk=backup.pk).update(expired_at=now)
        expired.append(backup.pk)
    return expired


def rpo_exposure(now: datetime | None = None) -> float | None:
    """Seconds of changes a restore now would lose: now minus the newest verified backup's snapshot."""
    newest = Backup.objects.newest_verified()
    if newest is None or newest.consistent_as_of is None:
        return None
    return ((now or timezone.now()) - newest.consistent_as_of).total_seconds()
