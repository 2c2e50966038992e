"""PostgreSQL advisory locks that mark work as alive, and the plain connections they are held on.

A lock taken here is held for the life of the work's own session: PostgreSQL releases it however the
process ends, so a sweeper that can take it knows the work it names is dead. Backups, restores,
verifications and artifact acquisitions use it; each owns a range of second keys (``*_LOCK_BASE`` in the
module that takes them: apps.backups.pgtools, apps.artifacts.locks), so none collides with another.

Every connection here is a plain psycopg connection, not Django's pool: a restore renames the database
Django's pool points at, and the locks that mark a backup or restore as alive must outlive that.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings

# Advisory-lock namespace (the first key of the two-key form): "MFBK".
LOCK_NAMESPACE = 0x4D46424B


def lock_namespace() -> int:
    """The advisory locks' first key: ours, and this installation's. The locks live on the maintenance
    database, which every installation on one PostgreSQL server shares; the service database's name
    keeps two installations (or two test runs) on one server from holding each other's locks."""
    name = str(settings.DATABASES["default"]["NAME"])
    return (LOCK_NAMESPACE ^ zlib.crc32(name.encode())) & 0x7FFFFFFF


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
