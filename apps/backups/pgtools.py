"""PostgreSQL's own tools and the few server calls backups and restores need.

pg_dump and pg_restore come from ``MODELFORGE_PG_BIN_DIR`` or, by default, the embedded PostgreSQL
wheel (the same major as the embedded server); a backup refuses tools of another major than the server's
(``PG_TOOLS_MISMATCH``) rather than write an archive the server's own tools might not read.

The advisory locks that mark a backup, verification or restore as alive, and the plain connections to
the server, are apps.core.pglocks' (artifacts' acquisitions take them too); they are named here as well so
the backups modules keep saying ``pgtools.liveness_lock``.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from psycopg import sql

from apps.core.pglocks import (  # noqa: F401 - the backups modules' names for them
    LockHeld,
    Server,
    is_alive,
    liveness_lock,
    lock_namespace,
    service_server,
)

# The second keys of backups' advisory locks (apps.core.pglocks): a backup's id, VERIFY_LOCK_BASE + a
# backup's id (its verification), or RESTORE_LOCK_BASE + a restore's id. ACQUIRE_LOCK_BASE (1 << 29) is
# apps.artifacts.locks'.
VERIFY_LOCK_BASE = 1 << 28
RESTORE_LOCK_BASE = 1 << 30


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
