"""Dashboard pages for artifacts: list with progress, detail with checks, history, replicas, and the
operator's actions (replicate to a node or re-try a replica, release from quarantine with a reason, amend
a quarantined record, retry a failed acquisition, rehydrate)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.artifacts import acquisition, replication, services
from apps.artifacts.filtersets import ArtifactFilterSet
from apps.artifacts.models import Artifact, SourceKind
from apps.artifacts.tasks import acquire
from apps.nodes.models import Node
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError, describe_validation
from modelforge.filters import filtered
from modelforge.lookups import by_pk
from modelforge.validators import checked_text

staff_required: Any = staff_member_required(login_url="dashboard:login")


@staff_required
def artifact_list(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    filterset = ArtifactFilterSet(request.GET, queryset=Artifact.objects.all())
    page = Paginator(filtered(filterset), 50).get_page(request.GET.get("page"))
    context = {
        "filter": filterset,
        "page": page,
        "state": state,
        "source_kinds": SourceKind.choices,
        "active_nav": "artifacts",
    }
    return render(request, "artifacts/artifact_list.html", context)


@staff_required
@require_POST
def artifact_register(request: HttpRequest) -> HttpResponse:
    """Register an artifact by its upstream identity, through the API's serializer (the same refusals,
    shown by code and message), then acquire it as ``POST /api/v1/artifacts`` does."""
    from apps.artifacts.api.serializers import ArtifactSerializer

    data: dict[str, Any] = {
        name: request.POST[name]
        for name in ("name", "source_kind", "locator", "revision", "licence")
        if request.POST.get(name, "").strip() != ""
    }
    data["encrypted"] = request.POST.get("encrypted") == "true"
    try:
        lines = [
            line.split() for line in request.POST.get("expected_sha256", "").splitlines() if line.strip()
        ]
        if any(len(parts) != 2 for parts in lines):
            raise ApiError("VALIDATION_ERROR", "expected SHA-256: one 'path sha256' pair per line.", 400)
        if lines:
            data["expected_sha256"] = {path: digest for path, digest in lines}
        serializer = ArtifactSerializer(data=data)
        if not serializer.is_valid():
            raise ApiError("VALIDATION_ERROR", describe_validation(serializer.errors), 400)
        artifact = serializer.save()
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
        return redirect("artifacts:list")
    send_on_commit(acquire, artifact.pk)
    messages.info(request, f"{artifact.name} registered; acquiring it from {artifact.locator}.")
    return redirect("artifacts:detail", pk=artifact.pk)


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
            node = by_pk(Node.objects.all(), request.POST.get("node"))
            if node is None:
                raise ApiError("VALIDATION_ERROR", "node: choose an enrolled node.", 400)
            replication.request_replica(artifact, node, by=by)
            messages.info(request, f"Replicating {artifact.name} to {node.name}.")
        elif action == "retry":
            services.retry_acquisition(artifact, by=by)
            messages.info(request, f"Acquiring {artifact.name} again from {artifact.locator}.")
        elif action == "amend":
            _amend(request, artifact, by)
        elif action == "release":
            reason = checked_text("reason", request.POST.get("reason", ""), lines=True)
            released = acquisition.release(artifact, by=by, reason=reason)
            if released.state == "requested":
                messages.info(request, f"{artifact.name} released: fetching now; every check runs again.")
            else:
                messages.success(request, f"{artifact.name} released: every check passes.")
        elif action == "rehydrate":
            services.request_rehydration(artifact, by=by)
            messages.info(request, f"Rehydrating {artifact.name} from its recorded upstream.")
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    return redirect("artifacts:detail", pk=artifact.pk)


def _amend(request: HttpRequest, artifact: Artifact, by: str) -> None:
    """The licence and/or expected digests ("path sha256" per line) of a quarantined artifact."""
    from apps.artifacts.api.serializers import AmendSerializer

    data: dict[str, Any] = {"reason": request.POST.get("reason", "")}
    if request.POST.get("licence", "").strip():
        data["licence"] = request.POST["licence"].strip()
    lines = [line.split() for line in request.POST.get("expected_sha256", "").splitlines() if line.strip()]
    if any(len(parts) != 2 for parts in lines):
        raise ApiError("VALIDATION_ERROR", "expected SHA-256: one 'path sha256' pair per line.", 400)
    if lines:
        data["expected_sha256"] = {path: digest for path, digest in lines}
    serializer = AmendSerializer(data=data)
    if not serializer.is_valid():
        raise ApiError("VALIDATION_ERROR", describe_validation(serializer.errors), 400)
    changes = {k: v for k, v in serializer.validated_data.items() if k != "reason"}
    acquisition.amend(artifact, by=by, reason=serializer.validated_data["reason"], changes=changes)
    messages.success(
        request, f"{artifact.name} amended; it stays quarantined until a release passes every check."
    )
