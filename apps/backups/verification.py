"""Verifying a backup: its files against the manifest, a restore into a scratch database, the platform
invariants and the key tables' row counts checked there. Only a verified backup is restore-eligible.

1. Read the manifest; every file it lists must exist with its size and SHA-256 (a flipped byte fails
   here, naming the file).
2. Restore the dump into a fresh scratch database with pg_restore.
3. Run the invariants (authoritative tables only) and compare row counts with the manifest's.
4. Drop the scratch database, whatever happened; record every step's outcome.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import psycopg
from django.utils import timezone

from apps.alerts.models import Alert
from apps.backups import codes, pgtools, snapshot
from apps.backups.models import Backup, BackupState
from apps.core import registry

logger = logging.getLogger(__name__)


class VerificationFailed(Exception):
    def __init__(self, step: str, message: str):
        super().__init__(message)
        self.step = step
        self.message = message


def check_files(directory: Path, manifest: dict[str, Any] | None, recorded: list[dict[str, Any]]) -> None:
    """Every file the manifest lists matches its size and digest (and the manifest matches the record)."""
    if manifest is None:
        raise VerificationFailed(
            "manifest", f"{snapshot.MANIFEST_FILE} is missing or unreadable in {directory}"
        )
    files = manifest.get("files") or []
    if not files:
        raise VerificationFailed("manifest", "the manifest lists no files")
    if recorded and [(f["name"], f["sha256"]) for f in files] != [(f["name"], f["sha256"]) for f in recorded]:
        raise VerificationFailed("manifest", "the manifest on disk does not match the recorded one")
    for entry in files:
        path = directory / entry["name"]
        if not path.is_file():
            raise VerificationFailed("digests", f"{entry['name']} is missing")
        size = path.stat().st_size
        if size != entry["size"]:
            raise VerificationFailed(
                "digests", f"{entry['name']}: {size} bytes, the manifest says {entry['size']}"
            )
        found = snapshot.sha256_file(path)
        if found != entry["sha256"]:
            raise VerificationFailed(
                "digests", f"{entry['name']}: sha256 {found} does not match the manifest's {entry['sha256']}"
            )


def check_invariants(conn: psycopg.Connection[Any]) -> None:
    """Every platform invariant holds in the database behind ``conn``."""
    broken = []
    for invariant in registry.invariants:
        row = conn.execute(invariant.query).fetchone()
        if row and row[0]:
            broken.append(f"{invariant.name} ({invariant.description}): {row[0]} rows break it")
    if broken:
        raise VerificationFailed("invariants", "; ".join(broken))


def check_database(conn: psycopg.Connection[Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """Invariants, schema revision and row counts of a restored database against its manifest."""
    check_invariants(conn)
    revision, _ = snapshot.read_schema_revision(conn)
    if revision != manifest.get("schema_revision"):
        raise VerificationFailed("schema", "the restored schema revision differs from the manifest's")
    expected: dict[str, int] = manifest.get("row_counts") or {}
    found = snapshot.count_rows(conn, sorted(expected))
    differences = [
        f"{t}: {found.get(t)} rows, manifest {n}" for t, n in expected.items() if found.get(t) != n
    ]
    if differences:
        raise VerificationFailed("row_counts", "; ".join(differences))
    return {
        "invariants": len(registry.invariants),
        "tables_counted": len(expected),
        "rows": sum(expected.values()),
    }


def restore_and_check(server: pgtools.Server, archive: Path, database: str, manifest: dict[str, Any]) -> dict:
    pgtools.create_database(server, database)
    started = time.monotonic()
    try:
        pgtools.pg_restore(server, archive, database)
    except RuntimeError as exc:
        raise VerificationFailed("restore", str(exc)) from exc
    restored_s = time.monotonic() - started
    with server.connect(database) as conn:
        result = check_database(conn, manifest)
    return {**result, "restore_seconds": round(restored_s, 3)}


def verify(backup_id: int) -> str:
    """Verify a completed (or re-verify a verified) backup; returns its state afterwards. Under an
    advisory lock: a second delivery of the task (the watchdog re-sends a verification that waits) skips
    while the first runs."""
    try:
        with pgtools.liveness_lock(pgtools.service_server(), pgtools.VERIFY_LOCK_BASE + int(backup_id)):
            return _verify(backup_id)
    except pgtools.LockHeld:
        return "skipped"


def _verify(backup_id: int) -> str:
    backup = Backup.objects.filter(pk=backup_id).first()
    if backup is None or backup.state not in (BackupState.COMPLETED, BackupState.VERIFIED):
        return "skipped"
    server = pgtools.service_server()
    directory = Path(backup.directory)
    scratch = f"mf_verify_{backup.pk}_{secrets.token_hex(4)}"
    steps: dict[str, Any] = {"started_at": timezone.now().isoformat()}
    started = time.monotonic()
    try:
        manifest = snapshot.read_manifest(directory)
        check_files(directory, manifest, backup.files)
        assert manifest is not None
        steps["digests"] = "ok"
        steps.update(restore_and_check(server, directory / snapshot.DUMP_FILE, scratch, manifest))
    except (VerificationFailed, psycopg.Error, OSError) as error:
        # Fail closed: a backup that could not be checked (no right to create the scratch database, the
        # server gone) is not restore-eligible either; the message says which step and why.
        failure = (
            error
            if isinstance(error, VerificationFailed)
            else VerificationFailed("scratch", f"{type(error).__name__}: {error}")
        )
        steps.update(ok=False, failed_step=failure.step, message=failure.message)
        backup.transition(
            BackupState.FAILED,
            detail=f"{codes.VERIFICATION_FAILED} at {failure.step}: {failure.message}",
            reason_code=codes.VERIFICATION_FAILED,
            reason_message=f"{failure.step}: {failure.message}",
            verification=steps,
        )
        snapshot.raise_failed_alert(backup)
        return backup.state
    finally:
        pgtools.drop_database(server, scratch)
    steps.update(ok=True, seconds=round(time.monotonic() - started, 3))
    backup.transition(
        BackupState.VERIFIED,
        detail=f"restored into a scratch database and checked in {steps['seconds']} s",
        verified_at=timezone.now(),
        verification=steps,
    )
    Alert.objects.clear_for([codes.BACKUP_FAILED], *snapshot.INSTALLATION_SUBJECT[:2])
    snapshot.check_staleness()
    return backup.state
