"""Dashboard pages for nodes and enrollment tokens."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.alerts.models import Alert
from apps.nodes import codes, listening, liveness
from apps.nodes.api.serializers import EnrollmentTokenSerializer
from apps.nodes.filtersets import NodeFilterSet
from apps.nodes.models import EnrollmentToken, ListeningClock, Node, events_of
from apps.nodes.tasks import ping_node
from modelforge import dispatch
from modelforge.errors import ApiError, describe_validation
from modelforge.filters import filtered

staff_required: Any = staff_member_required(login_url="dashboard:login")


@staff_required
def node_list(request: HttpRequest) -> HttpResponse:
    filterset = NodeFilterSet(request.GET, queryset=Node.objects.with_liveness().prefetch_related("gpus"))
    page = Paginator(filtered(filterset), 50).get_page(request.GET.get("page"))
    context = {
        "filter": filterset,
        "page": page,
        # Read, not created: a page view is not the web stamp that starts the clock.
        "clock": ListeningClock.objects.filter(singleton=True).first(),
        "mass_loss": Alert.objects.open().filter(code=codes.ALERT_NODE_MASS_LOSS).first(),
        "active_nav": "nodes",
    }
    return render(request, "nodes/node_list.html", context)


@staff_required
def node_detail(request: HttpRequest, pk: str) -> HttpResponse:
    node = get_object_or_404(Node.objects.with_liveness().prefetch_related("gpus"), pk=pk)
    context = {
        "node": node,
        "assignable": node.is_assignable(),
        "events": events_of(node)[:30],
        # Its own, and the fleet's NODE_STALE or node_offline when it went with many others at once.
        "alerts": liveness.alerts_of(node),
        # The reverse relation only: what runs here is the servers app's, which nodes does not import.
        "servers": node.servers.order_by("name"),
        "active_nav": "nodes",
    }
    return render(request, "nodes/node_detail.html", context)


@staff_required
@require_POST
def node_set_enabled(request: HttpRequest, pk: str, enabled: bool) -> HttpResponse:
    node = get_object_or_404(Node, pk=pk)
    if node.set_enabled(enabled, by=request.user.get_username()):
        messages.success(request, f"Node {node.name} {'enabled' if enabled else 'disabled'}.")
    return redirect("nodes:detail", pk=node.pk)


@staff_required
@require_POST
def node_ping(request: HttpRequest, pk: str) -> HttpResponse:
    node = get_object_or_404(Node, pk=pk)
    try:
        dispatch.send_or_refuse(ping_node, str(node.pk))
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    else:
        messages.info(request, f"A signed ping to {node.name} is on its way; reload to see the result.")
    return redirect("nodes:detail", pk=node.pk)


@staff_required
@require_POST
def mass_loss_confirm(request: HttpRequest) -> HttpResponse:
    """The operator confirms the held mass loss (from the alerts page or the node list)."""
    try:
        listening.confirm_mass_loss(by=request.user.get_username())
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    else:
        messages.success(request, "Mass node loss confirmed: the held nodes go offline at the next sweep.")
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(back)
    return redirect("nodes:list")


MINTED_SESSION_KEY = "nodes.minted_token"


@staff_required
def token_list(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        # Post/redirect/get: a reload must never mint a second token. The plain value rides in the
        # session for exactly one page view, then it is gone.
        # The API's rules for the note (printable, one line: modelforge.validators).
        form = EnrollmentTokenSerializer(data={"note": request.POST.get("note", "")[:200]})
        if not form.is_valid():
            messages.error(request, f"VALIDATION_ERROR: {describe_validation(form.errors)}")
            return redirect("nodes:tokens")
        note = form.validated_data.get("note", "")
        token, plain = EnrollmentToken.objects.mint(note=note, created_by=request.user)
        request.session[MINTED_SESSION_KEY] = {"id": token.pk, "plain": plain}
        return redirect("nodes:tokens")
    minted = None
    stashed = request.session.pop(MINTED_SESSION_KEY, None)
    if stashed:
        minted = {"token": EnrollmentToken.objects.get(pk=stashed["id"]), "plain": stashed["plain"]}
    page = Paginator(EnrollmentToken.objects.select_related("node"), 50).get_page(request.GET.get("page"))
    return render(request, "nodes/token_list.html", {"page": page, "minted": minted, "active_nav": "nodes"})


@staff_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(EnrollmentToken, pk=pk)
    if token.revoke():
        messages.success(request, f"Token {token.display_prefix}… revoked.")
    return redirect("nodes:tokens")
