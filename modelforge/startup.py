"""Start-up validation: configuration rules and the refusal every entry point shares.

``collect_problems`` runs while settings load and must not touch Django. ``enforce`` runs at every entry
point (``manage.py``, gunicorn, the Celery worker and beat): in production it prints the problems and
exits with status 3; in development it logs them as warnings and lets the process start.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

from modelforge.config import (
    INSECURE_PRODUCTION_SETTING,
    MISSING_REQUIRED_SETTING,
    Problem,
    SettingsReader,
)

logger = logging.getLogger("modelforge.startup")

EXIT_REFUSED = 3

# Used only in development when no key is configured; production refuses it by name.
DEVELOPMENT_SECRET_KEY = "modelforge-development-secret-key-do-not-use-in-production"
MIN_SECRET_KEY_LENGTH = 50
MIN_OPERATOR_KEY_LENGTH = 32
MIN_CLUSTER_SECRET_LENGTH = 16

# Passwords that ship in tutorials, images and compose files; a production database must not use one.
WELL_KNOWN_DATABASE_PASSWORDS = frozenset(
    {
        "postgres",
        "password",
        "passw0rd",
        "modelforge",
        "changeme",
        "change-me",
        "secret",
        "admin",
        "root",
        "dev",
        "development",
        "test",
        "example",
        "123456",
    }
)


def collect_problems(
    read: SettingsReader,
    *,
    production: bool,
    secret_key: str | None,
    debug: bool,
    allowed_hosts: list[str],
    operator_api_key: str | None,
    database: dict[str, Any] | None,
    redis_url: str | None,
    cluster_secret: str | None = None,
) -> list[Problem]:
    """Every configuration problem of the kernel's own settings: those found while parsing, then the
    rules spanning them (required, then unsafe values).

    The rules are the same in both environments (development logs what production refuses), except
    where development has a deliberate default: DEBUG on, loopback hosts, the embedded stack's URLs.
    A rule over an app's settings (node liveness, the gateway's bench, artifact roots) is that app's
    system check (``modelforge.checks``), run with these at every entry point by ``enforce``.
    """
    del redis_url  # required-ness is checked by name below; its syntax while parsing
    _required_problems(read, production)
    _unsafe_secret_problems(read, secret_key, operator_api_key, cluster_secret)
    if debug and production:
        read.problem(
            INSECURE_PRODUCTION_SETTING,
            "MODELFORGE_DEBUG",
            "DEBUG is on in production, which exposes internals; unset it or set it to false",
        )
    if any(host.startswith("*") for host in allowed_hosts):
        read.problem(
            INSECURE_PRODUCTION_SETTING,
            "MODELFORGE_ALLOWED_HOSTS",
            "a wildcard host accepts any Host header; list the exact host names",
        )
    if database and str(database.get("PASSWORD") or "").lower() in WELL_KNOWN_DATABASE_PASSWORDS:
        read.problem(
            INSECURE_PRODUCTION_SETTING,
            "MODELFORGE_DATABASE_URL",
            "the database password is a well-known development value; set a strong password "
            "on the database role and in the URL",
        )
    # The reader's own list, not a copy: settings read after this call still report their problems.
    return read.problems


def _required_problems(read: SettingsReader, production: bool) -> None:
    """Settings that cannot be done without."""
    required = {
        "MODELFORGE_SECRET_KEY": "production requires a secret key; set it (or MODELFORGE_SECRET_KEY_FILE) "
        f"to at least {MIN_SECRET_KEY_LENGTH} random characters",
        "MODELFORGE_OPERATOR_API_KEY": "production requires an operator API key; set it (or "
        "MODELFORGE_OPERATOR_API_KEY_FILE) to a random value of at least "
        f"{MIN_OPERATOR_KEY_LENGTH} characters",
        "MODELFORGE_CLUSTER_SECRET": "a cluster secret is required to sign calls to node agents; set it (or "
        f"MODELFORGE_CLUSTER_SECRET_FILE) to at least {MIN_CLUSTER_SECRET_LENGTH} random characters, and "
        "give every agent the same value in MODELFORGE_AGENT_CLUSTER_SECRET",
    }
    if production:
        required |= {
            "MODELFORGE_DATABASE_URL": "production requires the PostgreSQL 16+ database URL, "
            "e.g. postgres://modelforge:<password>@db:5432/modelforge",
            "MODELFORGE_REDIS_URL": "production requires the Redis URL (broker and router state), "
            "e.g. redis://redis:6379/0",
            "MODELFORGE_ALLOWED_HOSTS": "production requires the host names this service answers to, "
            "comma separated, e.g. modelforge.example.org",
        }
    for name, message in required.items():
        if not read.is_set(name):
            read.problem(MISSING_REQUIRED_SETTING, name, message)


def _unsafe_secret_problems(
    read: SettingsReader, secret_key: str | None, operator_api_key: str | None, cluster_secret: str | None
) -> None:
    """Secrets that are set but unsafe. Judge only a value that was read: a secret set twice or an
    unreadable file is reported as such."""
    if secret_key:
        if secret_key == DEVELOPMENT_SECRET_KEY or secret_key.startswith("django-insecure"):
            read.problem(
                INSECURE_PRODUCTION_SETTING,
                "MODELFORGE_SECRET_KEY",
                "the secret key is a published default; generate a new random one",
            )
        elif len(secret_key) < MIN_SECRET_KEY_LENGTH:
            read.problem(
                INSECURE_PRODUCTION_SETTING,
                "MODELFORGE_SECRET_KEY",
                f"the secret key is {len(secret_key)} characters; use at least {MIN_SECRET_KEY_LENGTH} "
                "random characters",
            )
    if operator_api_key and len(operator_api_key) < MIN_OPERATOR_KEY_LENGTH:
        read.problem(
            INSECURE_PRODUCTION_SETTING,
            "MODELFORGE_OPERATOR_API_KEY",
            f"the operator API key is {len(operator_api_key)} characters; use at least "
            f"{MIN_OPERATOR_KEY_LENGTH} random characters",
        )
    if cluster_secret and len(cluster_secret) < MIN_CLUSTER_SECRET_LENGTH:
        read.problem(
            INSECURE_PRODUCTION_SETTING,
            "MODELFORGE_CLUSTER_SECRET",
            f"the cluster secret is {len(cluster_secret)} characters; use at least "
            f"{MIN_CLUSTER_SECRET_LENGTH} random characters",
        )


def refusal_text(problems: list[Problem]) -> str:
    header = f"ModelForge refused to start: {len(problems)} configuration problem(s) must be resolved."
    return "\n".join([header, *(problem.line() for problem in problems)])


def refuse(text: str) -> NoReturn:
    """Print the refusal on stderr and exit with status 3, from whatever entry point we are in."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_REFUSED)


def enforce(entry_point: str) -> None:
    """Report configuration problems: exit 3 in production, warn and continue in development."""
    from django.conf import settings

    from modelforge.checks import all_problems

    problems = all_problems()
    if not problems:
        return
    if settings.PRODUCTION:
        refuse(refusal_text(problems))
    for problem in problems:
        logger.warning("%s (%s, development: starting anyway)", problem.line(), entry_point)


def enforce_database(entry_point: str) -> None:
    """Refuse to serve on a database this release cannot use (web, worker, beat), in any environment.

    An unreachable database is not a verdict: the process starts, says so, and ``/readyz`` reports it
    until the database answers (a restart loop would hide the cause).
    """
    from modelforge.compatibility import DatabaseUnreachable, check_database

    try:
        incompatibility = check_database()
    except DatabaseUnreachable as exc:
        logger.error("%s: database unreachable at start-up (%s); /readyz reports it", entry_point, exc)
        return
    if incompatibility is not None:
        refuse(incompatibility.refusal())


def enforce_database_server(alias: str = "default") -> None:
    """Refuse to migrate on a PostgreSQL older than 16, in any environment (exit 3).

    Only the server is judged: an empty, older or foreign schema (UNKNOWN, TOO_OLD) is what ``migrate``
    is run to fix, and an unreachable database is reported by ``migrate`` itself.
    """
    from modelforge.compatibility import DatabaseUnreachable, check_server

    try:
        incompatibility = check_server(alias)
    except DatabaseUnreachable:
        return
    if incompatibility is not None:
        refuse(incompatibility.refusal())


_checked_entry_point: str | None = None


def run_entry_checks(entry_point: str) -> None:
    """Configuration then database, once per process (a forked gunicorn worker inherits the verdict)."""
    global _checked_entry_point
    if _checked_entry_point is not None:
        return
    import django

    django.setup()
    enforce(entry_point)
    enforce_database(entry_point)
    from django.db import connections

    # Never hand an open connection, or a pool and its threads, to forked children.
    connections.close_all()
    for connection in connections.all(initialized_only=True):
        close_pool = getattr(connection, "close_pool", None)
        if close_pool is not None:
            close_pool()
    _checked_entry_point = entry_point
