"""Dashboard pages: clusters with their load-balancer card, capabilities and credentials at a glance."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from apps.clusters.loadbalancer import cluster_report
from apps.clusters.models import Capability, ClientCredential, Cluster

staff_required: Any = staff_member_required(login_url="dashboard:login")


@staff_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    context = {
        "clusters": Cluster.objects.prefetch_related("members__server"),
        "capabilities": Capability.objects.prefetch_related("tiers__cluster", "tiers__server"),
        "credentials": ClientCredential.objects.all()[:50],
        "active_nav": "clusters",
    }
    return render(request, "clusters/cluster_list.html", context)


@staff_required
def cluster_detail(request: HttpRequest, pk: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=pk)
    return render(
        request,
        "clusters/cluster_detail.html",
        {"cluster": cluster, "lb": cluster_report(cluster), "active_nav": "clusters"},
    )
