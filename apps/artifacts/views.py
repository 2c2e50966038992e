"""Dashboard pages for artifacts: list with progress, detail with checks, history, replicas, and the
operator's actions (replicate to a node, release from quarantine with a reason, rehydrate)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.artifacts import acquisition, replication
from apps.artifacts.models import Artifact
from apps.artifacts.tasks import rehydrate
from apps.nodes.models import Node
from modelforge.errors import ApiError

staff_required: Any = staff_member_required(login_url="dashboard:login")


@staff_required
def artifact_list(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    queryset = Artifact.objects.all()
    if state:
        queryset = queryset.filter(state=state)
    page = Paginator(queryset, 50).get_page(request.GET.get("page"))
    return render(
        request, "artifacts/artifact_list.html", {"page": page, "state": state, "active_nav": "artifacts"}
    )


@staff_required
def artifact_detail(request: HttpRequest, pk: int) -> HttpResponse:
    artifact = get_object_or_404(Artifact, pk=pk)
    context = {
        "artifact": artifact,
        "replicas": artifact.replicas.select_related("node"),
        "events": artifact.events.all()[:50],
        "nodes": Node.objects.order_by("name"),
        "active_nav": "artifacts",
    }
    return render(request, "artifacts/artifact_detail.html", context)


@staff_required
@require_POST
def artifact_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    artifact = get_object_or_404(Artifact, pk=pk)
    by = request.user.get_username()
    try:
        if action == "replicate":
            node = get_object_or_404(Node, pk=request.POST.get("node"))
            replication.request_replica(artifact, node, by=by)
            messages.info(request, f"Replicating {artifact.name} to {node.name}.")
        elif action == "release":
            released = acquisition.release(artifact, by=by, reason=request.POST.get("reason", ""))
            if released.state == "requested":
                messages.info(request, f"{artifact.name} released: fetching now; every check runs again.")
            else:
                messages.success(request, f"{artifact.name} released: every check passes.")
        elif action == "rehydrate":
            transaction.on_commit(lambda: rehydrate.delay(artifact.pk))
            messages.info(request, f"Rehydrating {artifact.name} from its recorded upstream.")
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    return redirect("artifacts:detail", pk=artifact.pk)
