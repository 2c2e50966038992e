"""Telemetry history: a copy of every GPU's last reading, taken every ``MODELFORGE_TELEMETRY_SAMPLE_INTERVAL``
seconds by the worker and kept ``MODELFORGE_TELEMETRY_RETENTION_DAYS`` days.

The heartbeat path is untouched: it writes only the authoritative current reading (``nodes.GPU``). The
sampler reads those and writes the copies to the ``observability`` alias; if that store fails, the
failure is ``OBSERVABILITY_DEGRADED`` (an alert in the authoritative database, cleared by the next
successful sample) and nothing else notices.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.nodes.models import GPU
from apps.observability.models import TelemetrySample
from modelforge.dbrouter import OBSERVABILITY

logger = logging.getLogger("apps.observability")

OBSERVABILITY_DEGRADED = "OBSERVABILITY_DEGRADED"
_SUBJECT = ("observability", "telemetry", "monitoring store")


class ObservabilityUnavailable(Exception):
    """The monitoring store could not be read or written."""


def sample(now: datetime | None = None) -> dict[str, int]:
    """Copy the current readings of GPUs reported within the last interval; drop expired samples."""
    now = now or timezone.now()
    fresh_after = now - timedelta(seconds=2 * settings.TELEMETRY_SAMPLE_INTERVAL)
    readings = list(
        GPU.objects.select_related("node")
        .filter(reported_at__gte=fresh_after)
        .only("node__id", "node__name", *[f.name for f in GPU._meta.fields if f.name != "node"])
    )
    rows = [
        TelemetrySample(
            node_id=gpu.node.id,
            node_name=gpu.node.name,
            gpu_index=gpu.index,
            at=now,
            reported_at=gpu.reported_at,
            memory_total_bytes=gpu.memory_total_bytes,
            memory_used_bytes=gpu.memory_used_bytes,
            memory_managed_bytes=gpu.memory_managed_bytes,
            utilization_percent=gpu.utilization_percent,
            temperature_c=gpu.temperature_c,
        )
        for gpu in readings
    ]
    try:
        TelemetrySample.objects.bulk_create(rows, batch_size=5000)
        expired, _ = TelemetrySample.objects.filter(
            at__lt=now - timedelta(days=settings.TELEMETRY_RETENTION_DAYS)
        ).delete()
    except DatabaseError as exc:
        _degraded(exc, now)
        return {"sampled": 0, "expired": 0, "degraded": 1}
    Alert.objects.clear_for([OBSERVABILITY_DEGRADED], _SUBJECT[0], _SUBJECT[1], now)
    return {"sampled": len(rows), "expired": expired, "degraded": 0}


def history(node_id: Any, since: datetime) -> list[TelemetrySample]:
    """A node's samples since ``since``; ``ObservabilityUnavailable`` when the store fails."""
    try:
        return list(
            TelemetrySample.objects.filter(node_id=node_id, at__gte=since).order_by("gpu_index", "at")
        )
    except DatabaseError as exc:
        _close()
        raise ObservabilityUnavailable(_describe(exc)) from None


def _degraded(exc: DatabaseError, now: datetime) -> None:
    _close()
    reason = _describe(exc)
    logger.warning("monitoring store unavailable: %s", reason)
    Alert.objects.raise_alert(
        OBSERVABILITY_DEGRADED,
        Severity.WARNING,
        *_SUBJECT,
        f"Monitoring persistence is unavailable ({reason}); telemetry history is not being kept. "
        "Serving, scheduling and recovery continue on their own authoritative state.",
        now,
    )


def _describe(exc: DatabaseError) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no detail'}"[
        :300
    ]


def _close() -> None:
    """Drop the failed connection, so the next use connects afresh."""
    with contextlib.suppress(DatabaseError):
        connections[OBSERVABILITY].close()
