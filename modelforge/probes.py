"""Probes of the platform's stores: is the database, is the broker reachable, and why not. Used by
``/readyz`` (``modelforge.health``), the system status and the outage checks (``apps.core``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import psycopg
import redis
from django.conf import settings
from django.db import DatabaseError, connection, connections


@dataclass
class Probe:
    """One dependency's reachability, with a reason when it is not reachable."""

    ok: bool
    detail: str


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=1, socket_timeout=1)


def probe_database() -> Probe:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('server_version')")
            (version,) = cursor.fetchone()
    except DatabaseError as exc:
        # The driver's text may name hosts or users; keep the kind of failure only.
        return Probe(False, f"database unreachable ({type(exc).__name__})")
    return Probe(True, f"PostgreSQL {version}")


# A new connection must be made within this; a database that cannot is not ready, whatever a pooled
# connection says (issue 13: during a stall pooled sessions answered while no new one could be made).
NEW_CONNECTION_TIMEOUT_S = 2


def probe_database_connection(overrides: dict[str, object] | None = None) -> Probe:
    """A new connection to the default database, made directly (not from the pool) within 2 s.

    The parameters are Django's own for the default alias, so what is proved is what a new pooled
    connection would need. ``overrides`` replaces some of them (a test points one at a closed port).
    """
    params = connections["default"].get_connection_params()
    params.update(connect_timeout=NEW_CONNECTION_TIMEOUT_S, application_name="modelforge-probe")
    params.update(overrides or {})
    try:
        with psycopg.connect(**params, autocommit=True) as new:
            row = new.execute("SELECT current_setting('server_version')").fetchone()
    except (psycopg.Error, OSError) as exc:
        # The driver's text may name hosts or users; keep the kind of failure only.
        return Probe(
            False,
            f"database unreachable: no new connection within {NEW_CONNECTION_TIMEOUT_S} s "
            f"({type(exc).__name__})",
        )
    return Probe(True, f"PostgreSQL {row[0] if row else '?'}")


def probe_broker() -> Probe:
    try:
        info = redis_client().info("server")
    except redis.RedisError as exc:
        return Probe(False, f"broker unreachable ({type(exc).__name__})")
    return Probe(True, f"Redis {info.get('redis_version', '?')}")
