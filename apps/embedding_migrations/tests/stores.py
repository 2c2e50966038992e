"""Scratch vector stores for tests: fresh databases on the test PostgreSQL server, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import psycopg
from django.conf import settings
from psycopg import sql


def _server() -> dict[str, Any]:
    db = settings.DATABASES["default"]
    return {
        "host": str(db.get("HOST") or "127.0.0.1"),
        "port": int(db.get("PORT") or 5432),
        "user": str(db.get("USER") or "postgres"),
        "password": str(db.get("PASSWORD") or ""),
    }


def _maintenance() -> psycopg.Connection[Any]:
    server = _server()
    return psycopg.connect(
        host=server["host"],
        port=server["port"],
        user=server["user"],
        password=server["password"] or None,
        dbname="postgres",
        autocommit=True,
        connect_timeout=5,
    )


def vector_dsn(database: str) -> str:
    """``postgresql://user[:password]@host:port/database`` on the test server."""
    server = _server()
    credentials = quote(server["user"], safe="")
    if server["password"]:
        credentials += ":" + quote(server["password"], safe="")
    host = server["host"]
    if host.startswith("/"):
        return f"postgresql://{credentials}@/{database}?host={quote(host, safe='')}&port={server['port']}"
    if ":" in host:
        host = f"[{host}]"
    return f"postgresql://{credentials}@{host}:{server['port']}/{database}"


@contextmanager
def scratch_vector_dsn() -> Iterator[str]:
    """A fresh database (``mfvec_<12 hex>``) on Django's PostgreSQL server; yields its DSN, then drops it."""
    name = f"mfvec_{uuid.uuid4().hex[:12]}"
    with _maintenance() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield vector_dsn(name)
    finally:
        with _maintenance() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def sever_vector_connections(dsn: str) -> int:
    """Terminate every session on ``dsn``'s database, as a restart of the store would; returns how many."""
    database = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with _maintenance() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [database],
        ).fetchall()
    return len(rows)
