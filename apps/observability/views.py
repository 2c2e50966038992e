"""Dashboard: a node's telemetry history, or why it cannot be shown (OBSERVABILITY_DEGRADED)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from apps.nodes.models import Node
from apps.observability import sampling
from apps.observability.charts import Series, chart, gib, percent, plain
from apps.observability.models import HostSample, TelemetrySample

MANAGED, EXTERNAL, FREE = "#2f5bd3", "#d97706", "#d1d5db"  # the node page's memory bar, in the same order


@staff_member_required(login_url="dashboard:login")
def node_telemetry(request: HttpRequest, pk: str) -> HttpResponse:
    node = get_object_or_404(Node, pk=pk)
    minutes = 60
    since = timezone.now() - timedelta(minutes=minutes)
    error = ""
    by_gpu: dict[int, list[TelemetrySample]] = defaultdict(list)
    hosts: list[HostSample] = []
    try:
        for row in sampling.history(node.pk, since):
            by_gpu[row.gpu_index].append(row)
        hosts = sampling.host_history(node.pk, since)
    except sampling.ObservabilityUnavailable as exc:
        error = str(exc)
    gpus = [
        {
            "index": index,
            "samples": rows[-30:],
            "peak_used": max(r.memory_used_bytes for r in rows),
            "peak_utilization": max(r.utilization_percent for r in rows),
            "peak_temperature": max(r.temperature_c for r in rows),
            "charts": _gpu_charts(index, rows),
        }
        for index, rows in sorted(by_gpu.items())
    ]
    context = {
        "node": node,
        "gpus": gpus,
        "host_charts": _host_charts(hosts),
        "error": error,
        "minutes": minutes,
        "active_nav": "nodes",
    }
    return render(request, "observability/node_telemetry.html", context)


def _gpu_charts(index: int, rows: list[TelemetrySample]) -> list[str]:
    times = [r.at for r in rows]
    memory = chart(
        f"gpu-{index}-memory",
        f"GPU {index} memory",
        times,
        [
            Series("ModelForge-managed", MANAGED, [r.memory_managed_bytes for r in rows]),
            Series(
                "External", EXTERNAL, [max(0, r.memory_used_bytes - r.memory_managed_bytes) for r in rows]
            ),
            Series("Free", FREE, [max(0, r.memory_total_bytes - r.memory_used_bytes) for r in rows]),
        ],
        y_format=gib,
        y_max=max(r.memory_total_bytes for r in rows),
        stacked=True,
    )
    utilization = chart(
        f"gpu-{index}-utilization",
        f"GPU {index} utilization",
        times,
        [Series("Utilization", MANAGED, [r.utilization_percent for r in rows])],
        y_format=percent,
        y_max=100,
    )
    return [memory, utilization]


def _host_charts(rows: list[HostSample]) -> list[str]:
    """RAM (used and available, stacked to the total) and the 1-minute load against the CPU count."""
    if not rows:
        return []
    times = [r.at for r in rows]
    ram = chart(
        "host-memory",
        "RAM",
        times,
        [
            Series(
                "Used",
                MANAGED,
                [
                    None
                    if r.memory_total_bytes is None or r.memory_available_bytes is None
                    else max(0, r.memory_total_bytes - r.memory_available_bytes)
                    for r in rows
                ],
            ),
            Series("Available", FREE, [r.memory_available_bytes for r in rows]),
        ],
        y_format=gib,
        y_max=max((r.memory_total_bytes or 0) for r in rows) or None,
        stacked=True,
    )
    cpus = max((r.cpu_count or 0) for r in rows)
    load = chart(
        "host-load",
        f"Load (1 minute) · {cpus} CPUs" if cpus else "Load (1 minute)",
        times,
        [Series("Load 1m", EXTERNAL, [r.load_1m for r in rows])],
        y_format=plain,
        y_max=max([float(cpus), *(r.load_1m or 0.0 for r in rows)]) or None,
    )
    return [ram, load]


@staff_member_required(login_url="dashboard:login")
def traffic(request: HttpRequest) -> HttpResponse:
    from apps.servers.models import ModelServer

    minutes = 60
    error = ""
    rows = []
    try:
        rows = sampling.traffic(timezone.now() - timedelta(minutes=minutes))
    except sampling.ObservabilityUnavailable as exc:
        error = str(exc)
    names = {str(pk): name for pk, name in ModelServer.objects.values_list("pk", "name")}
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"requests": 0, "errors": 0})
    for row in rows:
        totals[row.backend]["requests"] += row.requests
        totals[row.backend]["errors"] += row.errors
    backends = [
        {"backend": key, "name": names.get(key, "(removed server)"), **counts}
        for key, counts in sorted(totals.items(), key=lambda item: -item[1]["requests"])
    ]
    context = {
        "backends": backends,
        "rows": [(row, names.get(row.backend, "(removed server)")) for row in rows[:200]],
        "error": error,
        "minutes": minutes,
        "active_nav": "clusters",
    }
    return render(request, "observability/traffic.html", context)


USAGE_WINDOWS = {
    "1": ("hour", "the last 24 hours, per hour"),
    "7": ("day", "the last 7 days, per day"),
    "30": ("day", "the last 30 days, per day"),
    "0": ("minute", "the last hour, per minute"),
}


@staff_member_required(login_url="dashboard:login")
def usage_page(request: HttpRequest) -> HttpResponse:
    """Usage per credential and capability: totals over a window, and tokens over time as a chart."""
    from apps.observability.usage import usage_rows

    window = request.GET.get("window", "1")
    if window not in USAGE_WINDOWS:
        window = "1"
    granularity, described = USAGE_WINDOWS[window]
    since = timezone.now() - (timedelta(hours=1) if window == "0" else timedelta(days=int(window)))
    error = ""
    rows: list[dict[str, Any]] = []
    try:
        rows = usage_rows(since, granularity=granularity, group_by=("credential", "capability"))
    except sampling.ObservabilityUnavailable as exc:
        error = str(exc)
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    per_period: dict = defaultdict(lambda: [0, 0])
    for row in rows:
        key = (row["credential"], row["capability"])
        total = totals.setdefault(
            key,
            {
                "credential": row["credential"],
                "credential_name": row["credential_name"] or "(deleted credential)",
                "capability": row["capability"],
                "requests": 0,
                "errors": 0,
                "unmetered": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
            },
        )
        for name in ("requests", "errors", "unmetered", "prompt_tokens", "completion_tokens"):
            total[name] += row[name]
        per_period[row["period"]][0] += row["prompt_tokens"]
        per_period[row["period"]][1] += row["completion_tokens"]
    times = sorted(per_period)
    tokens_chart = (
        chart(
            "usage-tokens",
            f"Tokens, {described}",
            times,
            [
                Series("prompt", MANAGED, [per_period[t][0] for t in times]),
                Series("completion", EXTERNAL, [per_period[t][1] for t in times]),
            ],
            stacked=True,
        )
        if len(times) > 1
        else ""
    )
    ranked = sorted(totals.values(), key=lambda t: -(t["prompt_tokens"] + t["completion_tokens"]))
    context: dict[str, Any] = {
        "totals": ranked,
        "chart": tokens_chart,
        "error": error,
        "window": window,
        "windows": [(key, text) for key, (_, text) in USAGE_WINDOWS.items()],
        "described": described,
        "active_nav": "clusters",
    }
    return render(request, "observability/usage.html", context)
