"""Dashboard pages: clusters with their load-balancer card, capabilities and credentials at a glance."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.clusters.loadbalancer import cluster_report
from apps.clusters.models import Capability, ClientCredential, Cluster

staff_required: Any = staff_member_required(login_url="dashboard:login")
MINTED_SESSION_KEY = "clusters.minted_credential"


@staff_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    context = {
        "clusters": Cluster.objects.prefetch_related("members__server"),
        "capabilities": Capability.objects.prefetch_related("tiers__cluster", "tiers__server"),
        "credentials": ClientCredential.objects.all()[:50],
        "capability_names": Capability.objects.order_by("name").values_list("name", flat=True),
        "minted": _take_minted(request),
        "active_nav": "clusters",
    }
    return render(request, "clusters/cluster_list.html", context)


def _take_minted(request: HttpRequest) -> dict[str, Any] | None:
    """The credential just minted, for exactly one page view (post/redirect/get: a reload never
    mints a second one, and the plain value is gone from the session once shown)."""
    stashed = request.session.pop(MINTED_SESSION_KEY, None)
    if not stashed:
        return None
    return {
        "credential": ClientCredential.objects.filter(pk=stashed["id"]).first(),
        "plain": stashed["plain"],
    }


@staff_required
@require_POST
def credential_mint(request: HttpRequest) -> HttpResponse:
    """Mint a client credential: the same validation as the API (exact ``name@version`` scopes)."""
    from apps.clusters.api.serializers import ClientCredentialSerializer

    days = request.POST.get("expires_in_days", "").strip()
    data = {
        "name": request.POST.get("name", ""),
        "scopes": request.POST.getlist("scopes"),
        "project": request.POST.get("project", ""),
    }
    if days:
        if not days.isdigit() or not 1 <= int(days) <= 3650:
            messages.error(request, "VALIDATION_ERROR: expires in days: a whole number from 1 to 3650.")
            return redirect("clusters:list")
        data["expires_at"] = (timezone.now() + timedelta(days=int(days))).isoformat()
    serializer = ClientCredentialSerializer(data=data)
    if not serializer.is_valid():
        problems = "; ".join(
            f"{field}: {' '.join(map(str, errs))}" for field, errs in serializer.errors.items()
        )
        messages.error(request, f"VALIDATION_ERROR: {problems}")
        return redirect("clusters:list")
    credential, plain = ClientCredential.objects.mint(
        name=serializer.validated_data["name"],
        scopes=serializer.validated_data["scopes"],
        project=serializer.validated_data.get("project", ""),
        expires_at=serializer.validated_data.get("expires_at"),
        created_by=request.user,
    )
    request.session[MINTED_SESSION_KEY] = {"id": credential.pk, "plain": plain}
    return redirect("clusters:list")


@staff_required
@require_POST
def credential_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    credential = get_object_or_404(ClientCredential, pk=pk)
    if credential.revoke():
        messages.success(request, f"Credential {credential.name} ({credential.display_prefix}…) revoked.")
    else:
        messages.info(request, f"Credential {credential.name} was already revoked.")
    return redirect("clusters:list")


@staff_required
def cluster_detail(request: HttpRequest, pk: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=pk)
    return render(
        request,
        "clusters/cluster_detail.html",
        {"cluster": cluster, "lb": cluster_report(cluster), "active_nav": "clusters"},
    )
