"""Usage per credential, project, capability and backend, read back from ``UsageSample`` (rolled up by
the sampling task from the gateway's counters): one aggregation for the API, its CSV and the dashboard."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DatabaseError
from django.db.models import Sum
from django.db.models.functions import TruncDay, TruncHour, TruncMinute

from apps.gateway.usage import METRICS
from apps.observability.models import UsageSample
from apps.observability.sampling import ObservabilityUnavailable

GROUPS = ("credential", "project", "capability", "backend")
GRANULARITIES = {"minute": TruncMinute, "hour": TruncHour, "day": TruncDay}
SUMMED = METRICS  # every counter the gateway keeps per minute (apps/gateway/usage.py)
COLUMNS = (
    "period",
    "credential",
    "credential_name",
    "project",
    "capability",
    "backend",
    "requests",
    "errors",
    "unmetered",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms_avg",
    "latency_ms_avg",
)


def usage_rows(
    since: datetime,
    until: datetime | None = None,
    *,
    granularity: str = "day",
    group_by: tuple[str, ...] = ("credential", "capability"),
    filters: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One row per period and group, newest period first; the averages are per timed answer.
    ``ObservabilityUnavailable`` when the monitoring store fails."""
    rows = UsageSample.objects.filter(minute__gte=since)
    if until is not None:
        rows = rows.filter(minute__lt=until)
    for field, value in (filters or {}).items():
        rows = rows.filter(**{field: value})
    period = GRANULARITIES[granularity]("minute")
    try:
        found = list(
            rows.annotate(period=period)
            .values("period", *group_by)
            .annotate(**{name: Sum(name) for name in SUMMED})
            .order_by("-period", *group_by)
        )
    except DatabaseError as exc:
        raise ObservabilityUnavailable(str(exc)) from exc
    names = _credential_names({row["credential"] for row in found if "credential" in row})
    out = []
    for row in found:
        out.append(
            {
                "period": row["period"],
                **{group: row.get(group) for group in GROUPS},
                "credential_name": names.get(row.get("credential") or "", None),
                **{name: row[name] or 0 for name in SUMMED if name not in ("ttft_ms", "ttft_count")},
                "ttft_ms_avg": round(row["ttft_ms"] / row["ttft_count"], 1) if row["ttft_count"] else None,
                "latency_ms_avg": round(row["latency_ms"] / row["requests"], 1) if row["requests"] else None,
            }
        )
    return out


def _credential_names(ids: set[str]) -> dict[str, str]:
    from apps.clusters.models import ClientCredential

    try:
        found = ClientCredential.objects.filter(pk__in=[i for i in ids if i]).values_list("pk", "name")
        return {str(pk): name for pk, name in found}
    except (ValueError, ValidationError):  # an id of another installation's shape
        return {}
