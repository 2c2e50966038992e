"""Dashboard: a node's telemetry history, or why it cannot be shown (OBSERVABILITY_DEGRADED)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from apps.nodes.models import Node
from apps.observability import sampling


@staff_member_required(login_url="dashboard:login")
def node_telemetry(request: HttpRequest, pk: str) -> HttpResponse:
    node = get_object_or_404(Node, pk=pk)
    minutes = 60
    since = timezone.now() - timedelta(minutes=minutes)
    error = ""
    by_gpu: dict[int, list] = defaultdict(list)
    try:
        for row in sampling.history(node.pk, since):
            by_gpu[row.gpu_index].append(row)
    except sampling.ObservabilityUnavailable as exc:
        error = str(exc)
    gpus = [
        {
            "index": index,
            "samples": rows[-30:],
            "peak_used": max(r.memory_used_bytes for r in rows),
            "peak_utilization": max(r.utilization_percent for r in rows),
            "peak_temperature": max(r.temperature_c for r in rows),
        }
        for index, rows in sorted(by_gpu.items())
    ]
    context = {"node": node, "gpus": gpus, "error": error, "minutes": minutes, "active_nav": "nodes"}
    return render(request, "observability/node_telemetry.html", context)


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
