"""Database compatibility: is the database in front of this release one it can serve on?

1. PostgreSQL older than major 16 is refused, by ``migrate`` too (``check_server``): a schema created
   there would only be refused by every other entry point afterwards.
2. No migration history: ``UNKNOWN`` (an empty database, or someone else's).
3. History without ModelForge's own schema: ``UNKNOWN``.
4. A migration recorded that this release does not have: ``TOO_NEW`` (a newer release migrated it).
5. A migration this release has that is not applied: ``TOO_OLD`` (run migrate).

docs/COMPATIBILITY.md explains each verdict to operators.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.loader import MigrationLoader

from modelforge.errors import codes

MIN_POSTGRES_MAJOR = 16
# The app whose migrations mark a database as ModelForge's.
MARKER_APP = "core"

TOO_OLD = "TOO_OLD"
TOO_NEW = "TOO_NEW"
UNKNOWN = "UNKNOWN"
POSTGRES_TOO_OLD = "POSTGRES_TOO_OLD"


class DatabaseUnreachable(Exception):
    """The database did not answer; not a compatibility verdict."""


@dataclass(frozen=True)
class Incompatibility:
    """Why this release will not serve on the database, and what the operator should do."""

    reason: str
    message: str

    def line(self) -> str:
        return f"- [{codes.INCOMPATIBLE_DATABASE}] MODELFORGE_DATABASE_URL: {self.reason}: {self.message}"

    def refusal(self) -> str:
        return (
            f"ModelForge refused to start: the database is not compatible with release {settings.RELEASE}.\n"
            + self.line()
        )


def _name(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}"


def _server_version(connection: BaseDatabaseWrapper) -> int:
    try:
        connection.ensure_connection()
        return int(connection.cursor().connection.info.server_version)
    except DatabaseError as exc:
        raise DatabaseUnreachable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


def _server_verdict(server_version: int) -> Incompatibility | None:
    major = server_version // 10000
    if major < MIN_POSTGRES_MAJOR:
        return Incompatibility(
            POSTGRES_TOO_OLD,
            f"PostgreSQL {major}.{server_version % 10000} is older than the supported major "
            f"{MIN_POSTGRES_MAJOR}; upgrade the server (pg_upgrade or dump and restore) or point "
            "MODELFORGE_DATABASE_URL at a PostgreSQL 16+ server",
        )
    return None


def check_server(alias: str = "default") -> Incompatibility | None:
    """Step 1 alone: the server's version. What ``migrate`` checks, since steps 2-5 are its to fix."""
    return _server_verdict(_server_version(connections[alias]))


def check_database(alias: str = "default") -> Incompatibility | None:
    """Return why the database is incompatible, ``None`` if it is fine; raise if unreachable."""
    connection = connections[alias]
    server = _server_verdict(_server_version(connection))
    if server is not None:
        return server
    try:
        tables = set(connection.introspection.table_names())
    except DatabaseError as exc:
        raise DatabaseUnreachable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc

    if "django_migrations" not in tables:
        if not tables:
            return Incompatibility(
                UNKNOWN,
                "the database has no schema at all; if it is meant to be a new ModelForge database, "
                "run `python manage.py migrate` to create it",
            )
        return Incompatibility(
            UNKNOWN,
            f"the database holds {len(tables)} table(s) but no ModelForge schema history; it is not a "
            "ModelForge database: check MODELFORGE_DATABASE_URL",
        )

    loader = MigrationLoader(connection, ignore_no_migrations=True)
    applied = set(loader.applied_migrations or {})
    if not any(app == MARKER_APP for app, _ in applied):
        return Incompatibility(
            UNKNOWN,
            "the database has a migration history but not ModelForge's; it is not a ModelForge "
            "database (or its schema was never created): check MODELFORGE_DATABASE_URL, or run "
            "`python manage.py migrate` on an empty database",
        )

    known = set(loader.graph.nodes)
    unknown_applied = sorted(applied - known)
    if unknown_applied:
        shown = ", ".join(_name(key) for key in unknown_applied[:5])
        return Incompatibility(
            TOO_NEW,
            f"the database was migrated by a newer ModelForge release ({len(unknown_applied)} migration(s) "
            f"this release {settings.RELEASE} does not have: {shown}); run that release or newer, or "
            "restore a backup taken with this release",
        )

    unapplied = sorted(key for key in known if key not in applied and not _replaced_and_applied(loader, key))
    if unapplied:
        shown = ", ".join(_name(key) for key in unapplied[:5])
        return Incompatibility(
            TOO_OLD,
            f"{len(unapplied)} migration(s) of release {settings.RELEASE} are not applied yet ({shown}); "
            "take a backup, then run `python manage.py migrate` and start again",
        )
    return None


def _replaced_and_applied(loader: MigrationLoader, key: tuple[str, str]) -> bool:
    """A squashed migration counts as applied when everything it replaces is."""
    migration = loader.disk_migrations.get(key)
    replaces = getattr(migration, "replaces", None) or []
    applied = loader.applied_migrations or {}
    return bool(replaces) and all(tuple(r) in applied for r in replaces)
