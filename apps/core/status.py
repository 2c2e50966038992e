"""What the platform can say about itself: used by /readyz, the system API and the dashboard home."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from functools import lru_cache

import redis
from django.conf import settings
from django.db import DatabaseError, connection

from apps.core.models import Installation


@dataclass
class Probe:
    """One dependency's reachability, with a reason when it is not reachable."""

    ok: bool
    detail: str


@lru_cache(maxsize=1)
def _redis_client() -> redis.Redis:
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


def probe_broker() -> Probe:
    try:
        info = _redis_client().info("server")
    except redis.RedisError as exc:
        return Probe(False, f"broker unreachable ({type(exc).__name__})")
    return Probe(True, f"Redis {info.get('redis_version', '?')}")


@dataclass
class SystemStatus:
    """A snapshot of the platform's own health."""

    release: str
    environment: str
    database: Probe
    broker: Probe
    installation_id: str | None
    worker_seen_at: datetime | None
    worker_seen_hostname: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def system_status() -> SystemStatus:
    database = probe_database()
    broker = probe_broker()
    installation = Installation.objects.current() if database.ok else None
    return SystemStatus(
        release=settings.RELEASE,
        environment=settings.MODELFORGE_ENV,
        database=database,
        broker=broker,
        installation_id=str(installation.installation_id) if installation else None,
        worker_seen_at=installation.worker_seen_at if installation else None,
        worker_seen_hostname=installation.worker_seen_hostname if installation else "",
    )
