"""Dashboard pages for model servers: list, place (with the scheduler's explanation), detail, stop, and
the recovery of a failed server (restart, re-place, delete) and its restart policy."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.artifacts.models import Artifact, ArtifactState
from apps.nodes.engine_signals import engine_view
from apps.nodes.models import Node
from apps.servers import recovery, services
from apps.servers.api.serializers import PlaceRequestSerializer
from apps.servers.choices import RestartPolicy
from apps.servers.filtersets import ModelServerFilterSet
from apps.servers.models import ModelServer
from apps.servers.profiles import runtime_profiles
from apps.servers.scheduler import PlacementRefused
from apps.servers.usage import used_by
from modelforge.errors import ApiError
from modelforge.filters import filtered

staff_required: Any = staff_member_required(login_url="dashboard:login")


@staff_required
def server_list(request: HttpRequest) -> HttpResponse:
    filterset = ModelServerFilterSet(request.GET, queryset=ModelServer.objects.select_related("node"))
    page = Paginator(filtered(filterset), 50).get_page(request.GET.get("page"))
    return render(
        request, "servers/server_list.html", {"filter": filterset, "page": page, "active_nav": "servers"}
    )


@staff_required
def server_new(request: HttpRequest) -> HttpResponse:
    refusal: dict[str, Any] | None = None
    errors: dict[str, Any] = {}
    if request.method == "POST":
        data: dict[str, Any] = {
            k: v for k, v in request.POST.items() if k != "csrfmiddlewaretoken" and v != ""
        }
        if "weights_gib" in data:
            try:
                data["weights_bytes"] = int(float(str(data.pop("weights_gib"))) * 2**30)
            except ValueError:
                errors["weights_gib"] = ["Enter a number."]
        form = PlaceRequestSerializer(data=data)
        if not errors and form.is_valid():
            try:
                server = form.place()
            except PlacementRefused as exc:
                refusal = {
                    "code": exc.code,
                    "message": exc.summary,
                    "verdicts": [v.as_dict() for v in exc.verdicts],
                }
            except ApiError as exc:
                refusal = {"code": exc.code, "message": exc.message, "verdicts": []}
            else:
                messages.success(request, f"{server.name} placed on {server.node}; starting.")
                return redirect("servers:detail", pk=server.pk)
        else:
            errors.update(form.errors if not errors else {})
    nodes = list(Node.objects.assignable().order_by("name"))
    context = {
        "profiles": sorted(runtime_profiles().values(), key=lambda p: p.name),
        "restart_policies": RestartPolicy.choices,
        "nodes": nodes,
        "model_choices": _model_choices(nodes),
        "refusal": refusal,
        "errors": errors,
        "values": request.POST,
        "active_nav": "servers",
    }
    # A page that explains a refusal is a page (200), not an error response for the envelope to replace.
    return render(request, "servers/server_new.html", context)


def _model_choices(nodes: list[Node]) -> list[dict[str, str]]:
    """What the model field offers: each model an online node reported (with where), then each ready
    artifact. Only offered: the field stays free text and the API's serializer judges what is sent."""
    where: dict[str, list[str]] = {}
    for node in nodes:
        for entry in node.models_present or []:
            name = entry.get("name") if isinstance(entry, dict) else entry
            if isinstance(name, str) and name:
                where.setdefault(name, []).append(node.name)
    choices = [{"value": name, "label": f"on {', '.join(on)}"} for name, on in sorted(where.items())]
    for name in (
        Artifact.objects.filter(state=ArtifactState.READY).order_by("name").values_list("name", flat=True)
    ):
        if name not in where:
            choices.append({"value": name, "label": "ready artifact"})
    return choices


@staff_required
def server_detail(request: HttpRequest, pk: str) -> HttpResponse:
    server = get_object_or_404(ModelServer.objects.select_related("node"), pk=pk)
    context = {
        "server": server,
        "reservations": server.reservations.select_related("gpu"),
        "events": server.events.all()[:50],
        "used_by": used_by(server),
        "engine": engine_view(str(server.pk), str(server.node_id) if server.node_id else None),
        "next_restart_at": recovery.next_restart_at(server),
        "max_restart_attempts": settings.SERVER_RESTART_MAX_ATTEMPTS,
        "restart_policies": RestartPolicy.choices,
        "active_nav": "servers",
    }
    return render(request, "servers/server_detail.html", context)


@staff_required
@require_POST
def server_stop(request: HttpRequest, pk: str) -> HttpResponse:
    server = get_object_or_404(ModelServer, pk=pk)
    try:
        services.stop(server, by=services.operator_name(request.user))
        messages.info(request, f"Stopping {server.name}.")
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    return redirect("servers:detail", pk=server.pk)


@staff_required
@require_POST
def server_recover(request: HttpRequest, pk: str, action: str) -> HttpResponse:
    """Restart, re-place or delete a failed server (delete also a stopped one); a refusal is a message."""
    server = get_object_or_404(ModelServer.objects.select_related("node"), pk=pk)
    by = services.operator_name(request.user)
    try:
        if action == "delete":
            services.delete(server, by=by)
            messages.success(request, f"{server.name} deleted.")
            return redirect("servers:list")
        place_again = services.restart if action == "restart" else services.replace
        server = place_again(server, by=by)
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    else:
        messages.success(request, f"{server.name} placed again on {server.node}; starting.")
    return redirect("servers:detail", pk=pk)


@staff_required
@require_POST
def server_restart_policy(request: HttpRequest, pk: str) -> HttpResponse:
    server = get_object_or_404(ModelServer, pk=pk)
    try:
        changed = services.set_restart_policy(server, request.POST.get("restart_policy", ""))
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    else:
        if changed:
            messages.success(request, f"{server.name}: restart policy {server.restart_policy}.")
    return redirect("servers:detail", pk=server.pk)
