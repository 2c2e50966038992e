"""Backups on the real PostgreSQL 16: a manifest written last, verification in a scratch database, and
every way a backup fails closed (missing, read-only and full roots; a real process killed mid-backup)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from apps.alerts.models import Alert
from apps.backups import codes, pgtools, restore, snapshot, verification
from apps.backups.models import Backup, BackupState
from apps.core import registry
from modelforge.errors import ApiError
from tests.fixtures import PYTHON, ROOT, database_url, process_env, process_stopped, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def backup_root(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "backups"
    root.mkdir()
    settings.BACKUP_ROOT = root
    return root


def take_one() -> Backup:
    backup = snapshot.request_backup(trigger="operator", by="test")
    snapshot.take(backup.pk)
    backup.refresh_from_db()
    return backup


def test_a_backup_writes_its_manifest_last_and_verification_makes_it_restore_eligible(backup_root):
    Alert.objects.raise_alert("SOMETHING", "info", "x", "1", "x", "a row to count")
    backup = take_one()
    assert backup.state == BackupState.COMPLETED
    assert not backup.restore_eligible  # completed is not enough

    directory = Path(backup.directory)
    assert directory.parent == backup_root
    manifest = json.loads((directory / "manifest.json").read_text())
    dump = directory / "database.dump"
    assert manifest["files"] == [
        {"name": "database.dump", "size": dump.stat().st_size, "sha256": snapshot.sha256_file(dump)}
    ]
    assert manifest["database"]["name"] == settings.DATABASES["default"]["NAME"]
    assert manifest["database"]["server_version"].startswith("16")
    assert manifest["modelforge_version"] == settings.RELEASE
    assert "backups.0001_initial" in manifest["migrations"] and len(manifest["schema_revision"]) == 64
    assert manifest["row_counts"]["alerts_alert"] == 1
    assert manifest["started_at"] <= manifest["consistent_as_of"] <= manifest["finished_at"]
    assert sorted(p.name for p in directory.iterdir()) == ["database.dump", "manifest.json"]

    assert verification.verify(backup.pk) == BackupState.VERIFIED
    backup.refresh_from_db()
    assert backup.restore_eligible and backup.verified_at is not None
    assert backup.verification["ok"] is True and backup.verification["digests"] == "ok"
    assert backup.verification["invariants"] == len(registry.invariants)
    assert [e.to_state for e in backup.events.order_by("at", "id")] == ["running", "completed", "verified"]
    # The scratch database is gone again.
    with pgtools.service_server().maintenance() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'mf_verify_%'"
        ).fetchone() == (0,)


def test_a_flipped_byte_fails_verification_naming_the_file(backup_root):
    backup = take_one()
    dump = Path(backup.directory) / "database.dump"
    data = bytearray(dump.read_bytes())
    data[len(data) // 2] ^= 0x01
    dump.write_bytes(bytes(data))

    assert verification.verify(backup.pk) == BackupState.FAILED
    backup.refresh_from_db()
    assert backup.reason_code == codes.VERIFICATION_FAILED
    assert "database.dump" in backup.reason_message and "does not match" in backup.reason_message
    assert backup.verification["failed_step"] == "digests"
    assert not backup.restore_eligible
    with pytest.raises(ApiError) as refused:
        restore.request_restore(backup, by="ops", reason="try")
    assert refused.value.code == codes.BACKUP_NOT_RESTORE_ELIGIBLE
    assert Alert.objects.open().filter(code=codes.BACKUP_FAILED).exists()


def test_a_verified_backup_whose_file_changed_is_no_longer_eligible_when_verified_again(backup_root):
    backup = take_one()
    assert verification.verify(backup.pk) == BackupState.VERIFIED
    (Path(backup.directory) / "database.dump").write_bytes(b"PGDMP but not really")
    assert verification.verify(backup.pk) == BackupState.FAILED
    backup.refresh_from_db()
    assert "database.dump" in backup.reason_message


def test_a_dump_the_server_cannot_restore_fails_verification_at_the_restore_step(backup_root):
    # Regression: digests that match say nothing about whether pg_restore can read the archive.
    backup = take_one()
    dump = Path(backup.directory) / "database.dump"
    dump.write_bytes(b"not an archive")
    manifest_path = Path(backup.directory) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][0].update(size=dump.stat().st_size, sha256=snapshot.sha256_file(dump))
    manifest_path.write_text(json.dumps(manifest))
    Backup.objects.filter(pk=backup.pk).update(files=manifest["files"])
    assert verification.verify(backup.pk) == BackupState.FAILED
    backup.refresh_from_db()
    assert backup.verification["failed_step"] == "restore"


def test_a_missing_backup_root_fails_closed(tmp_path, settings):
    settings.BACKUP_ROOT = tmp_path / "not-there"
    backup = take_one()
    assert backup.state == BackupState.FAILED
    assert backup.reason_code == codes.DESTINATION_UNAVAILABLE
    assert "missing" in backup.reason_message
    assert not (tmp_path / "not-there").exists()
    alert = Alert.objects.open().get(code=codes.BACKUP_FAILED)
    assert codes.DESTINATION_UNAVAILABLE in alert.message


@pytest.fixture
def small_mount(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs of 2 MiB (remounted read-only by the test that needs it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_read_only_backup_root_fails_closed_leaving_nothing(small_mount, settings):
    subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True)
    settings.BACKUP_ROOT = small_mount
    backup = take_one()
    assert (backup.state, backup.reason_code) == (BackupState.FAILED, codes.DESTINATION_UNAVAILABLE)
    assert "not writable" in backup.reason_message
    assert list(small_mount.iterdir()) == []


def test_a_backup_root_that_fills_up_mid_dump_fails_closed_leaving_nothing(small_mount, settings):
    settings.BACKUP_ROOT = small_mount
    # About 6 MiB of incompressible text: the dump cannot fit in 2 MiB.
    for index in range(6):
        Alert.objects.raise_alert(
            "BULK", "info", "x", str(index), "x", base64.b64encode(os.urandom(800_000)).decode()
        )
    backup = take_one()
    assert (backup.state, backup.reason_code) == (BackupState.FAILED, codes.DESTINATION_UNAVAILABLE)
    assert "No space left on device" in backup.reason_message
    assert list(small_mount.iterdir()) == []


# --- a real backup process, killed -----------------------------------------------------------------------


def _backup_process(root: Path, pause_at: str | None = None) -> subprocess.Popen[bytes]:
    env = process_env(
        MODELFORGE_DATABASE_URL=database_url(),
        MODELFORGE_BACKUP_ROOT=str(root),
        MODELFORGE_TEST_PAUSE_AT=pause_at,
    )
    return subprocess.Popen(
        [PYTHON, "manage.py", "backups", "take"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _assert_interrupted(root: Path) -> Backup:
    assert snapshot.sweep_interrupted() == 1
    backup = Backup.objects.get()
    assert (backup.state, backup.reason_code) == (BackupState.FAILED, codes.MANIFEST_INCOMPLETE)
    assert list(root.iterdir()) == []  # nothing partial to mistake for a recovery point
    assert verification.verify(backup.pk) == "skipped"  # can never become eligible
    with pytest.raises(ApiError) as refused:
        restore.request_restore(backup, by="ops", reason="try")
    assert refused.value.code == codes.BACKUP_NOT_RESTORE_ELIGIBLE
    assert snapshot.sweep_interrupted() == 0
    return backup


@pytest.mark.parametrize("point", ["after_snapshot", "after_dump", "after_hash", "manifest_partial"])
def test_a_backup_process_killed_at_each_point_is_manifest_incomplete(backup_root, point):
    child = _backup_process(backup_root, pause_at=point)
    assert wait_until(lambda: process_stopped(child.pid), 60, 0.05), child.communicate()
    running = Backup.objects.get()
    assert running.state == BackupState.RUNNING
    # While its process lives (even stopped), the sweeper leaves it alone.
    assert snapshot.sweep_interrupted() == 0
    if point == "manifest_partial":
        assert (Path(running.directory) / "manifest.json.tmp").exists()
        assert not (Path(running.directory) / "manifest.json").exists()
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    # PostgreSQL notices the dead session and frees its liveness lock.
    assert wait_until(lambda: _lock_free(running.pk), 10)
    backup = _assert_interrupted(backup_root)
    assert f"while {running.phase}" in backup.reason_message


def _lock_free(key: int) -> bool:
    with pgtools.service_server().maintenance() as conn:
        return not pgtools.is_alive(conn, key)


def test_a_backup_process_killed_mid_dump_takes_its_pg_dump_with_it(backup_root):
    # pg_dump is held mid-dump by a lock on a table it must read; then its parent is killed for real.
    blocker = psycopg.connect(database_url())
    blocker.execute("LOCK TABLE alerts_alert IN ACCESS EXCLUSIVE MODE")
    # pg_stat_activity is read once per transaction: watch it from a connection of its own.
    watcher = psycopg.connect(database_url(), autocommit=True)
    child = _backup_process(backup_root)
    try:

        def pg_dump_waiting() -> bool:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_dump' "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            return bool(row and row[0])

        assert wait_until(pg_dump_waiting, 60, 0.05), "pg_dump never started"
        dumps = list(backup_root.glob("*/database.dump"))
        children = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
        pg_dump = [int(pid) for pid in children if Path(f"/proc/{pid}/comm").read_text().strip() == "pg_dump"]
        assert len(pg_dump) == 1
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        # PR_SET_PDEATHSIG: the dump dies with the backup's process, it does not finish unattended.
        assert wait_until(lambda: not Path(f"/proc/{pg_dump[0]}").exists(), 10, 0.05)
    finally:
        blocker.rollback()
        blocker.close()
        watcher.close()
    assert dumps, "the dump file existed when the process was killed"
    running = Backup.objects.get()
    assert running.phase == "dumping"
    assert wait_until(lambda: _lock_free(running.pk), 10)
    _assert_interrupted(backup_root)


def test_one_backup_at_a_time(backup_root):
    first = snapshot.request_backup(trigger="operator", by="a")
    with pytest.raises(ApiError) as refused:
        snapshot.request_backup(trigger="operator", by="b")
    assert refused.value.code == codes.BACKUP_IN_PROGRESS and f"#{first.pk}" in refused.value.message
    # A task delivered twice does the work once.
    assert snapshot.take(first.pk) == BackupState.COMPLETED
    assert snapshot.take(first.pk) == "skipped"


def test_tools_of_another_major_are_refused(backup_root, tmp_path, settings):
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("pg_dump", "pg_restore"):
        script = fake / name
        script.write_text("#!/bin/sh\necho 'pg_dump (PostgreSQL) 15.4'\n")
        script.chmod(0o755)
    settings.PG_BIN_DIR = str(fake)
    backup = take_one()
    assert (backup.state, backup.reason_code) == (BackupState.FAILED, codes.PG_TOOLS_MISMATCH)
    assert list(backup_root.iterdir()) == []
