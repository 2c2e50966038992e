"""PostgreSQL's own tools and the few server calls backups and restores need.

pg_dump and pg_restore come from ``MODELFORGE_PG_BIN_DIR`` or, by default, the embedded PostgreSQL
wheel (the same major as the embedded server); a backup refuses tools of another major than the server's
(``PG_TOOLS_MISMATCH``) rather than write an archive the server's own tools might not read.

Every connection here is a plain psycopg connection, not Django's pool: a restore renames the database
Django's pool points at, and the locks that mark a backup or restore as alive must outlive that.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from psycopg import sql

# Advisory-lock namespace (the first key of the two-key form): "MFBK".
LOCK_NAMESPACE = 0x4D46424B


def lock_namespace() -> int:
    """The advisory locks' first key: ours, and this installation's. The locks live on the maintenance
    database, which every installation on one PostgreSQL server shares; the service database's name
    keeps two installations (or two test runs) on one server from holding each other's locks."""
    name = str(settings.DATABASES["default"]["NAME"])
    return (LOCK_NAMESPACE ^ zlib.crc32(name.encode())) & 0x7FFFFFFF


# The second key: a backup's id, VERIFY_LOCK_BASE + a backup's id (its verification),
# ACQUIRE_LOCK_BASE + an artifact's id (its acquisition), or RESTORE_LOCK_BASE + a restore's id.
VERIFY_LOCK_BASE = 1 << 28
ACQUIRE_LOCK_BASE = 1 << 29
RESTORE_LOCK_BASE = 1 << 30


@dataclass(frozen=True)
class Server:
    """Where the control-plane database lives and how to reach it."""

    host: str
    port: int
    user: str
    password: str
    database: str

    def libpq_env(self, database: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PGHOST=self.host,
            PGPORT=str(self.port),
            PGUSER=self.user,
            PGDATABASE=database or self.database,
        )
        env.pop("PGAPPNAME", None)  # the tools name themselves (pg_dump, pg_restore) in pg_stat_activity
        if self.password:
            env["PGPASSWORD"] = self.password
        else:
            env.pop("PGPASSWORD", None)
        return env

    def connect(self, database: str | None = None, *, autocommit: bool = True) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password or None,
            dbname=database or self.database,
            autocommit=autocommit,
            application_name="modelforge-backups",
            connect_timeout=10,
        )

    def maintenance(self) -> psycopg.Connection[Any]:
        """A connection to the maintenance database, which a switch-over never touches."""
        return self.connect(settings.BACKUP_MAINTENANCE_DATABASE)


def service_server() -> Server:
    db = settings.DATABASES["default"]
    return Server(
        host=str(db.get("HOST") or "127.0.0.1"),
        port=int(db.get("PORT") or 5432),
        user=str(db.get("USER") or "postgres"),
        password=str(db.get("PASSWORD") or ""),
        database=str(db["NAME"]),
    )


def bin_dir() -> Path | None:
    if settings.PG_BIN_DIR:
        return Path(settings.PG_BIN_DIR)
    try:
        from modelforge.embedded import postgres_bin_dir

        return postgres_bin_dir()
    except ImportError:  # pragma: no cover - without the embedded extra, PATH is used
        return None


def tool(name: str) -> str:
    directory = bin_dir()
    if directory is not None and (directory / name).exists():
        return str(directory / name)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found in MODELFORGE_PG_BIN_DIR ({directory}) or on PATH")
    return found


def tool_major(name: str) -> int:
    out = subprocess.run([tool(name), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    if not match:
        raise ValueError(f"cannot read the version of {name}: {out!r}")
    return int(match.group(1))


def server_major(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    return int(row[0]) // 10000


def _die_with_parent() -> None:
    """Runs in the child before exec: if the process that started it dies, so does it (Linux)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A child tool that dies with us: a killed backup never leaves a pg_dump writing behind it."""
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_die_with_parent
    )


def create_database(server: Server, name: str) -> None:
    with server.maintenance() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(server: Server, name: str) -> None:
    with server.maintenance() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def database_exists(server: Server, name: str) -> bool:
    with server.maintenance() as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def pg_restore(server: Server, archive: Path, database: str) -> None:
    """Restore ``archive`` into the (empty) ``database``; raises with pg_restore's own words."""
    argv = [
        tool("pg_restore"),
        "--no-owner",
        "--no-privileges",
        "--exit-on-error",
        f"--jobs={settings.BACKUP_RESTORE_JOBS}",
        f"--dbname={database}",
        str(archive),
    ]
    child = popen(argv, server.libpq_env(database))
    _, err = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"pg_restore exited {child.returncode}: {err.decode(errors='replace')[-2000:]}")


class LockHeld(Exception):
    """Another live process holds the lock."""


@contextmanager
def liveness_lock(server: Server, key: int) -> Iterator[psycopg.Connection[Any]]:
    """Hold an advisory lock for as long as this work is alive.

    PostgreSQL releases it when our session ends, however the process ends, so a sweeper that can take
    the lock knows the work it names is dead: that is how an interrupted backup or restore is told from
    a slow one. Taken on the maintenance database, which a switch-over never renames.
    """
    conn = server.maintenance()
    try:
        row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", [lock_namespace(), key]).fetchone()
        if not (row and row[0]):
            raise LockHeld(key)
        yield conn
    finally:
        conn.close()


def is_alive(conn: psycopg.Connection[Any], key: int) -> bool:
    """True if a live session holds the lock ``key`` (probed without keeping it)."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", [lock_namespace(), key]).fetchone()
    if row and row[0]:
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", [lock_namespace(), key])
        return False
    return True
