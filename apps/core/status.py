"""What the platform can say about itself: used by the system API and the dashboard home (the probes of
its stores are the kernel's, ``modelforge.probes``, which /readyz answers with)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from django.conf import settings

from apps.core.models import Installation
from modelforge.probes import Probe, probe_broker, probe_database


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
    beat_seen_at: datetime | None
    beat_seen_hostname: str

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
        beat_seen_at=installation.beat_seen_at if installation else None,
        beat_seen_hostname=installation.beat_seen_hostname if installation else "",
    )
