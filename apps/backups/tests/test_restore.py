"""A restore round trip on a service database of its own, through real processes: markers written
after the backup are gone after the restore and the measured RPO matches their times; a restore
killed mid-phase is RESTORE_FAILED, leaves the database in service untouched, is not resumed by a
restart, and only an operator's review clears it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fixtures import (
    PYTHON,
    ROOT,
    admin_connection,
    database_url,
    process_env,
    process_stopped,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Service:
    """A migrated control-plane database of its own, and how to run ``manage.py`` against it."""

    name: str
    root: Path

    def env(self, pause_at: str | None = None) -> dict[str, str]:
        return process_env(
            MODELFORGE_DATABASE_URL=database_url(self.name),
            MODELFORGE_BACKUP_ROOT=str(self.root),
            MODELFORGE_TEST_PAUSE_AT=pause_at,
        )

    def manage(self, *args: str, check: bool = True) -> dict[str, Any]:
        done = subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        if check:
            assert done.returncode == 0, done.stderr[-3000:]
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))
        return {"returncode": done.returncode, "stderr": done.stderr}

    def start(self, *args: str, pause_at: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env=self.env(pause_at),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def connect(self, name: str | None = None) -> psycopg.Connection[Any]:
        return psycopg.connect(database_url(name or self.name), autocommit=True)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def mark(self, label: str) -> datetime:
        """A marker row in an authoritative table, written now; returns when."""
        rows = self.query(
            "INSERT INTO alerts_alert (code, severity, subject_type, subject_id, subject_name, dedup_key, "
            "message, raised_at, last_raised_at, occurrences) "
            "VALUES ('MARKER', 'info', 'marker', %s, %s, %s, 'marker', "
            "clock_timestamp(), clock_timestamp(), 1) "
            "RETURNING raised_at",
            label,
            label,
            f"MARKER:{label}",
        )
        return rows[0][0]

    def markers(self, name: str | None = None) -> set[str]:
        with self.connect(name) as conn:
            return {r[0] for r in conn.execute("SELECT subject_id FROM alerts_alert WHERE code = 'MARKER'")}

    def oid(self) -> int:
        with admin_connection() as conn:
            row = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", [self.name]).fetchone()
            assert row is not None
            return int(row[0])

    def restore_row(self, restore_id: int) -> dict[str, Any]:
        with self.connect() as conn:
            cursor = conn.execute(
                "SELECT state, phase, needs_review, failure_code, failure_message, switched_over, "
                "rpo_seconds, target_database, review_decision, reviewed_by "
                "FROM backups_restore WHERE id = %s",
                [restore_id],
            )
            names = [c.name for c in cursor.description or []]
            row = cursor.fetchone()
            assert row is not None
            return dict(zip(names, row, strict=True))


def _databases(prefix: str) -> set[str]:
    with admin_connection() as conn:
        return {
            r[0]
            for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [prefix + "%"])
        }


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    name = f"mf_svc_{os.getpid()}"
    with admin_connection() as conn:
        for leftover in _databases(name):
            conn.execute(f'DROP DATABASE "{leftover}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    root = tmp_path / "backups"
    root.mkdir()
    svc = Service(name, root)
    done = subprocess.run(
        [PYTHON, "manage.py", "migrate", "--no-input"],
        cwd=ROOT,
        env=svc.env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    yield svc
    with admin_connection() as conn:
        for database in _databases(name):
            conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')


def test_a_restore_round_trip_loses_exactly_what_came_after_the_backup(service):
    service.mark("before")
    taken = service.manage("backups", "take")
    assert taken["state"] == "verified"
    (consistent_as_of,) = service.query(
        "SELECT consistent_as_of FROM backups_backup WHERE id = %s", taken["backup"]
    )[0]
    first = service.mark("after-1")
    last = service.mark("after-2")
    assert consistent_as_of < first < last

    done = service.manage("backups", "restore", str(taken["backup"]), "--by", "ops", "--reason", "round trip")
    assert done["state"] == "completed"

    assert service.markers() == {"before"}  # what came after the backup is gone...
    previous = f"{service.name}_pre_restore_{done['restore']}"
    assert service.markers(previous) == {"before", "after-1", "after-2"}  # ...and kept beside it
    # The measured RPO covers every lost change and no more than the time until the switch-over.
    rpo = timedelta(seconds=done["rpo_seconds"])
    row = service.restore_row(done["restore"])
    assert row["state"] == "completed" and row["switched_over"] is True
    (switched_at,) = service.query(
        "SELECT finished_at FROM backups_restorephase WHERE restore_id = %s AND name = 'switch_over'",
        done["restore"],
    )[0]
    assert last - consistent_as_of < rpo <= switched_at - consistent_as_of
    phases = service.query(
        "SELECT name, outcome FROM backups_restorephase WHERE restore_id = %s ORDER BY id", done["restore"]
    )
    assert phases == [
        ("pre_checks", "ok"),
        ("restore", "ok"),
        ("verification", "ok"),
        ("switch_over", "ok"),
        ("post_checks", "ok"),
    ]
    # The catalogue came along: the backup is still listed, verified, in the restored database.
    assert service.query("SELECT state FROM backups_backup WHERE id = %s", taken["backup"]) == [("verified",)]
    # And the tables' storage settings: the node table keeps the room a whole-fleet sweep rewrites its rows
    # into (nodes.0005), so a restore never brings back the slow sweep.
    assert service.query("SELECT reloptions FROM pg_class WHERE relname = 'nodes_node'") == [
        (["fillfactor=50"],)
    ]


@pytest.mark.parametrize("point", ["restore_restoring", "restore_verified", "before_switch"])
def test_a_restore_killed_before_the_switch_over_fails_leaving_the_service_database_untouched(service, point):
    taken = service.manage("backups", "take")
    service.mark("after-backup")
    oid = service.oid()

    child = service.start(
        "backups", "restore", str(taken["backup"]), "--by", "ops", "--reason", "drill", pause_at=point
    )
    assert wait_until(lambda: process_stopped(child.pid), 120, 0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    (restore_id,) = service.query("SELECT max(id) FROM backups_restore")[0]
    assert service.restore_row(restore_id)["state"] == "running"  # nobody has looked yet

    # A fresh process (a restart) finds it dead: RESTORE_FAILED, awaiting review, not resumed.
    assert wait_until(lambda: service.manage("backups", "sweep")["interrupted_restores"] == 1, 10, 0.2)
    row = service.restore_row(restore_id)
    assert (row["state"], row["failure_code"], row["needs_review"]) == ("failed", "RESTORE_FAILED", True)
    assert row["switched_over"] is False
    assert service.oid() == oid and service.markers() == {"after-backup"}  # untouched
    phases = service.query(
        "SELECT name, outcome FROM backups_restorephase WHERE restore_id = %s ORDER BY id", restore_id
    )
    assert phases[-1][1] == "interrupted" and all(outcome == "ok" for _, outcome in phases[:-1])
    alert = service.query(
        "SELECT code FROM alerts_alert WHERE code = 'RESTORE_FAILED' AND cleared_at IS NULL"
    )
    assert alert == [("RESTORE_FAILED",)]

    # Another restore is refused until an operator reviews this one; a restart does not resume it.
    refused = service.manage(
        "backups", "restore", str(taken["backup"]), "--by", "ops", "--reason", "again", check=False
    )
    assert refused["returncode"] != 0 and "RESTORE_FAILED" in refused["stderr"]
    assert service.manage("backups", "sweep")["interrupted_restores"] == 0
    assert service.restore_row(restore_id)["state"] == "failed"

    # Abandon: recorded with who and why, the left-over database dropped, the alert cleared.
    target = row["target_database"]
    service.manage("backups", "review", str(restore_id), "abandon", "--by", "ops", "--reason", "drill over")
    row = service.restore_row(restore_id)
    assert (row["needs_review"], row["review_decision"], row["reviewed_by"]) == (False, "abandon", "ops")
    assert target == "" or target not in _databases(target)
    assert service.query(
        "SELECT count(*) FROM alerts_alert WHERE code = 'RESTORE_FAILED' AND cleared_at IS NULL"
    ) == [(0,)]
    again = service.manage("backups", "restore", str(taken["backup"]), "--by", "ops", "--reason", "for real")
    assert again["state"] == "completed"


def test_a_restore_killed_after_the_switch_over_needs_review_of_the_restored_database(service):
    taken = service.manage("backups", "take")
    service.mark("lost")
    child = service.start(
        "backups",
        "restore",
        str(taken["backup"]),
        "--by",
        "ops",
        "--reason",
        "drill",
        pause_at="restore_post_checks",
    )
    assert wait_until(lambda: process_stopped(child.pid), 120, 0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    # The switch-over committed: the restored database is in service and holds the restore's record.
    assert service.markers() == set()
    assert wait_until(lambda: service.manage("backups", "sweep")["interrupted_restores"] == 1, 10, 0.2)
    (restore_id,) = service.query("SELECT max(id) FROM backups_restore")[0]
    row = service.restore_row(restore_id)
    assert (row["state"], row["needs_review"], row["switched_over"]) == ("failed", True, True)
    service.manage(
        "backups", "review", str(restore_id), "acknowledge", "--by", "ops", "--reason", "checked by hand"
    )
    assert service.restore_row(restore_id)["review_decision"] == "acknowledge"
