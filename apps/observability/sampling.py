"""Monitoring history, taken every ``MODELFORGE_TELEMETRY_SAMPLE_INTERVAL`` seconds by the worker and kept
``MODELFORGE_TELEMETRY_RETENTION_DAYS`` days: a copy of every GPU's last reading, of every node's host
reading (RAM, load: the only history a CPU node has), and the gateway's per-minute requests and errors
per backend.

The heartbeat and serving paths are untouched: they write only the authoritative current reading
(``nodes.GPU``) and the routers' counters in Redis. The sampler copies those to the ``observability``
alias; if that store fails, the failure is ``OBSERVABILITY_DEGRADED`` (an alert in the authoritative
database, cleared by the next successful sample) and nothing else notices.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.nodes.models import GPU, Node
from apps.observability.codes import OBSERVABILITY_DEGRADED
from apps.observability.models import HostSample, TelemetrySample, TrafficSample, UsageSample
from modelforge.dbrouter import OBSERVABILITY

logger = logging.getLogger("apps.observability")

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
    hosts = host_readings(fresh_after, now)
    cutoff = now - timedelta(days=settings.TELEMETRY_RETENTION_DAYS)
    try:
        TelemetrySample.objects.bulk_create(rows, batch_size=5000)
        HostSample.objects.bulk_create(hosts, batch_size=5000)
        traffic_rows = roll_up_traffic()
        usage_rows = roll_up_usage()
        UsageSample.objects.filter(minute__lt=now - timedelta(days=settings.USAGE_RETENTION_DAYS)).delete()
        expired, _ = TelemetrySample.objects.filter(at__lt=cutoff).delete()
        expired_hosts, _ = HostSample.objects.filter(at__lt=cutoff).delete()
        expired_traffic, _ = TrafficSample.objects.filter(minute__lt=cutoff).delete()
    except DatabaseError as exc:
        _degraded(exc, now)
        return {"sampled": 0, "hosts": 0, "traffic": 0, "usage": 0, "expired": 0, "degraded": 1}
    Alert.objects.clear_for([OBSERVABILITY_DEGRADED], _SUBJECT[0], _SUBJECT[1], now)
    return {
        "sampled": len(rows),
        "hosts": len(hosts),
        "traffic": traffic_rows or 0,
        "usage": usage_rows or 0,
        "expired": expired + expired_hosts + expired_traffic,
        "degraded": 0,
    }


def host_readings(fresh_after: datetime, now: datetime) -> list[HostSample]:
    """Host readings (RAM, load) of every node that reported one since ``fresh_after``, GPU or CPU."""
    nodes = Node.objects.filter(last_heartbeat_at__gte=fresh_after).exclude(
        memory_total_bytes__isnull=True, load_1m__isnull=True
    )
    return [
        HostSample(
            node_id=node.id,
            node_name=node.name,
            at=now,
            reported_at=node.last_heartbeat_at or now,
            memory_total_bytes=node.memory_total_bytes,
            memory_available_bytes=node.memory_available_bytes,
            load_1m=node.load_1m,
            cpu_count=node.cpu_count,
        )
        for node in nodes.only(
            "id",
            "name",
            "last_heartbeat_at",
            "memory_total_bytes",
            "memory_available_bytes",
            "load_1m",
            "cpu_count",
        )
    ]


ROLL_UP_MINUTES = 10  # each run re-reads the last ten complete minutes; rows already kept are left


def roll_up_traffic() -> int | None:
    """Copy the gateway's per-minute counters (requests, errors per backend) for the last complete
    minutes; returns the rows written, or ``None`` when Redis could not be read (nothing to copy: the
    gateway says so itself). Raises ``DatabaseError`` when the monitoring store fails."""
    from apps.gateway.lbstate import TRAFFIC_BUCKET_S, read_traffic_minutes

    buckets = read_traffic_minutes(ROLL_UP_MINUTES)
    if buckets is None:
        return None
    rows = [
        TrafficSample(
            backend=backend,
            minute=datetime.fromtimestamp(bucket * TRAFFIC_BUCKET_S, tz=UTC),
            requests=traffic.get(backend, 0),
            errors=errors.get(backend, 0),
        )
        for bucket, (traffic, errors) in buckets.items()
        for backend in set(traffic) | set(errors)
    ]
    # Several runs see the same minute: the first one's row stays (the minute was complete then).
    return len(TrafficSample.objects.bulk_create(rows, ignore_conflicts=True))


# A minute is rolled up this long after it ends: a flush that began in it has landed by then.
USAGE_SETTLE_S = 5


def roll_up_usage(now: float | None = None) -> int | None:
    """Copy the gateway's usage counters (apps/gateway/usage.py) of every complete minute not copied yet
    into ``UsageSample`` rows; returns the rows written, ``None`` when Redis could not be read. Raises
    ``DatabaseError`` when the monitoring store fails: the minutes stay in Redis (a day) for the next run.

    Idempotent: a minute's rows are written with its whole counts (an upsert, not an addition), and the
    mark of the last minute copied moves only after they are committed; a run that dies in between
    writes the same rows again."""
    import time

    import redis

    from apps.gateway.usage import METRICS, USAGE_KEEP_S, USAGE_KEY, USAGE_ROLLED_KEY, split_field

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=2)
    last = int(((now or time.time()) - USAGE_SETTLE_S) // 60) - 1  # the last complete minute
    try:
        mark = client.get(USAGE_ROLLED_KEY)
        first = max(int(mark) + 1 if mark else last - ROLL_UP_MINUTES, last - USAGE_KEEP_S // 60 + 1)
        if first > last:
            return 0
        pipe = client.pipeline(transaction=False)
        for bucket in range(first, last + 1):
            pipe.hgetall(USAGE_KEY.format(bucket=bucket))
        minutes = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("usage not rolled up: Redis unavailable (%s)", exc)
        return None
    rows: dict[tuple[int, str, str, str], UsageSample] = {}
    for bucket, counts in zip(range(first, last + 1), minutes, strict=True):
        for raw, value in counts.items():
            parts = split_field(raw.decode() if isinstance(raw, bytes) else raw)
            if parts is None:
                continue
            credential, project, capability, backend, metric = parts
            row = rows.get((bucket, credential, capability, backend))
            if row is None:
                row = rows[(bucket, credential, capability, backend)] = UsageSample(
                    minute=datetime.fromtimestamp(bucket * 60, tz=UTC),
                    credential=credential,
                    project=project,
                    capability=capability,
                    backend=backend,
                )
            setattr(row, metric, int(value))
    if rows:
        UsageSample.objects.bulk_create(
            list(rows.values()),
            batch_size=2000,
            update_conflicts=True,
            unique_fields=["minute", "credential", "capability", "backend"],
            update_fields=["project", *METRICS],
        )
    with contextlib.suppress(redis.RedisError, OSError):
        client.set(USAGE_ROLLED_KEY, last)
    return len(rows)


def usage(since: datetime) -> Any:
    """Usage rows since ``since`` (a queryset to aggregate); ``ObservabilityUnavailable`` on failure."""
    return UsageSample.objects.filter(minute__gte=since)


def traffic(since: datetime, backend: str | None = None) -> list[TrafficSample]:
    """Per-minute traffic since ``since``; ``ObservabilityUnavailable`` when the store fails."""
    try:
        rows = TrafficSample.objects.filter(minute__gte=since)
        if backend:
            rows = rows.filter(backend=backend)
        return list(rows.order_by("-minute", "backend")[:5000])
    except DatabaseError as exc:
        _close()
        raise ObservabilityUnavailable(_describe(exc)) from None


def history(node_id: Any, since: datetime) -> list[TelemetrySample]:
    """A node's samples since ``since``; ``ObservabilityUnavailable`` when the store fails."""
    try:
        return list(
            TelemetrySample.objects.filter(node_id=node_id, at__gte=since).order_by("gpu_index", "at")
        )
    except DatabaseError as exc:
        _close()
        raise ObservabilityUnavailable(_describe(exc)) from None


def host_history(node_id: Any, since: datetime) -> list[HostSample]:
    """A node's host samples since ``since``; ``ObservabilityUnavailable`` when the store fails."""
    try:
        return list(HostSample.objects.filter(node_id=node_id, at__gte=since).order_by("at"))
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
