"""Dashboard pages: clusters with their load-balancer card, members, capabilities with their routing tiers,
client credentials and projects' default limits, each with the operator's actions. Every form validates
through the API's serializers and refuses with the API's codes (``CLUSTER_MEMBERSHIP_LOCKED`` while
servers are attached)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.clusters import playground, services
from apps.clusters.choices import CredentialKind
from apps.clusters.loadbalancer import cluster_report, queue_depths
from apps.clusters.models import (
    LIMIT_FIELDS,
    Algorithm,
    Capability,
    ClientCredential,
    Cluster,
    ClusterMember,
    ProjectLimits,
    RoutingTier,
    effective_limits,
    project_defaults,
)
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer
from modelforge.errors import ApiError, describe_validation, envelope_response
from modelforge.errors import codes as error_codes
from modelforge.lookups import by_pk

staff_required: Any = staff_member_required(login_url="dashboard:login")
MINTED_SESSION_KEY = "clusters.minted_credential"


@staff_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    capabilities = list(
        Capability.objects.select_related("follows", "embedding_space").prefetch_related(
            "tiers__cluster", "tiers__server"
        )
    )
    depths = queue_depths()  # the gateway's admission queues, across its processes (None: Redis away)
    for cap in capabilities:
        cap.waiting = None if depths is None else depths.get(cap.name, 0)  # type: ignore[attr-defined]
    context = {
        "clusters": Cluster.objects.prefetch_related("members__server"),
        "capabilities": capabilities,
        # An expired playground credential is of no more use to anyone: left out (the admin lists them).
        "credentials": ClientCredential.objects.exclude(
            kind=CredentialKind.PLAYGROUND, expires_at__lte=timezone.now()
        )[:50],
        "capability_names": Capability.objects.order_by("name").values_list("name", flat=True),
        "algorithms": Algorithm.choices,
        "servers": ModelServer.objects.order_by("name").only("pk", "name"),
        # Offered for a new cluster: running or starting servers that serve no member yet.
        "free_servers": ModelServer.objects.filter(
            state__in=["pending", "placing", "starting", "running"], cluster_member__isnull=True
        ).order_by("name"),
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
        messages.error(request, f"VALIDATION_ERROR: {describe_validation(serializer.errors)}")
        return redirect("clusters:list")
    credential, plain = serializer.mint(created_by=request.user)
    request.session[MINTED_SESSION_KEY] = {"id": credential.pk, "plain": plain}
    return redirect("clusters:list")


@staff_required
def credential_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A credential: its limits (a form through the API's serializer) and what it uses now."""
    from apps.clusters.limits import current_use

    credential = get_object_or_404(ClientCredential, pk=pk)
    use = current_use(str(credential.pk))
    defaults = project_defaults(credential.project)
    applied = effective_limits(credential, defaults)
    labels = {
        "requests_per_minute": ("Requests per minute", "requests_last_minute", "in the last 60 s"),
        "tokens_per_minute": ("Tokens per minute", "tokens_this_minute", "this minute"),
        "max_concurrent": ("Concurrent requests", "in_flight", "in flight"),
        "tokens_per_day": ("Tokens per day (UTC)", "tokens_today", "today"),
        "tokens_per_month": ("Tokens per month (UTC)", "tokens_this_month", "this month"),
    }
    limits = [
        {
            "field": f,
            "label": labels[f][0],
            "own": getattr(credential, f),
            "limit": applied[f][0],
            "source": applied[f][1],
            "default": getattr(defaults, f) if defaults is not None else None,
            "used": use[labels[f][1]],
            "when": labels[f][2],
        }
        for f in LIMIT_FIELDS
    ]
    context = {
        "credential": credential,
        "limits": limits,
        "defaults": defaults,
        "enforced": use["limits_enforced"],
        "active_nav": "clusters",
    }
    return render(request, "clusters/credential_detail.html", context)


@staff_required
@require_POST
def credential_limits(request: HttpRequest, pk: int) -> HttpResponse:
    """Set the credential's limits: the same validation as ``POST /api/v1/client-credentials/{id}/limits``."""
    from apps.clusters.api.serializers import LIMIT_FIELDS, LimitsSerializer

    credential = get_object_or_404(ClientCredential, pk=pk)
    data = {f: (request.POST.get(f, "").strip() or None) for f in LIMIT_FIELDS}
    serializer = LimitsSerializer(credential, data=data)
    if not serializer.is_valid():
        messages.error(request, f"VALIDATION_ERROR: {describe_validation(serializer.errors)}")
    else:
        serializer.save()
        messages.success(
            request, f"Limits of {credential.name} saved; every gateway applies them within a second."
        )
    return redirect("clusters:credential-detail", pk=pk)


LIMIT_LABELS = {
    "requests_per_minute": "Requests per minute",
    "tokens_per_minute": "Tokens per minute",
    "max_concurrent": "Concurrent requests",
    "tokens_per_day": "Tokens per day (UTC)",
    "tokens_per_month": "Tokens per month (UTC)",
}


@staff_required
def project_limits_list(request: HttpRequest) -> HttpResponse:
    """Every project's default limits, with a form for a new project's; and the projects that credentials
    name without defaults, each a click from a prefilled form."""
    rows = list(ProjectLimits.objects.all())
    credentials: dict[str, int] = {}
    for project in (
        ClientCredential.objects.filter(revoked_at__isnull=True)
        .exclude(project="")
        .values_list("project", flat=True)
    ):
        credentials[project] = credentials.get(project, 0) + 1
    for row in rows:
        row.values = [getattr(row, f) for f in LIMIT_FIELDS]  # type: ignore[attr-defined]
        row.credentials = credentials.get(row.project, 0)  # type: ignore[attr-defined]
    have = {row.project for row in rows}
    context = {
        "rows": rows,
        "labels": [LIMIT_LABELS[f] for f in LIMIT_FIELDS],
        "fields": [(f, LIMIT_LABELS[f]) for f in LIMIT_FIELDS],
        "without": sorted((p, n) for p, n in credentials.items() if p not in have),
        # ?project= (the credential page's "set them"): the new project's form, filled in.
        "project": request.GET.get("project", "")[:63],
        "active_nav": "project-limits",
    }
    return render(request, "clusters/project_limits.html", context)


def _limits_form(request: HttpRequest) -> dict[str, Any]:
    """The form as the API's body: the project exactly as typed (never trimmed: the serializer refuses
    surrounding spaces by name), each limit a number or null (empty: no default)."""
    return {
        "project": request.POST.get("project", ""),
        **{f: (request.POST.get(f, "").strip() or None) for f in LIMIT_FIELDS},
    }


@staff_required
@require_POST
def project_limits_create(request: HttpRequest) -> HttpResponse:
    """A project's default limits: the same validation as ``POST /api/v1/project-limits``."""
    from apps.clusters.api.serializers import ProjectLimitsSerializer

    saved = _save(
        request,
        ProjectLimitsSerializer(data=_limits_form(request)),
        "Default limits of project {0.project} saved; every gateway applies them within a second.",
    )
    if saved is None:
        typed = urlencode({"project": request.POST.get("project", "")[:63]})
        return redirect(f"{reverse('clusters:project-limits')}?{typed}")
    return redirect("clusters:project-limits")


@staff_required
def project_limits_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One project's default limits, to change or remove, with the credentials they apply to."""
    defaults = get_object_or_404(ProjectLimits, pk=pk)
    context = {
        "defaults": defaults,
        "fields": [(f, LIMIT_LABELS[f], getattr(defaults, f)) for f in LIMIT_FIELDS],
        "credentials": ClientCredential.objects.filter(project=defaults.project, revoked_at__isnull=True),
        "active_nav": "project-limits",
    }
    return render(request, "clusters/project_limits_detail.html", context)


@staff_required
@require_POST
def project_limits_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Change them: the same validation as ``PUT /api/v1/project-limits/{id}``."""
    from apps.clusters.api.serializers import ProjectLimitsSerializer

    defaults = get_object_or_404(ProjectLimits, pk=pk)
    _save(
        request,
        ProjectLimitsSerializer(defaults, data=_limits_form(request)),
        "Default limits of project {0.project} saved; every gateway applies them within a second.",
    )
    return redirect("clusters:project-limits-detail", pk)


@staff_required
@require_POST
def project_limits_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Remove them (``DELETE /api/v1/project-limits/{id}``): the project's credentials keep only their own."""
    defaults = get_object_or_404(ProjectLimits, pk=pk)
    defaults.delete()
    messages.success(
        request,
        f"Default limits of project {defaults.project} removed; its credentials keep only their own limits.",
    )
    return redirect("clusters:project-limits")


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
    context = {
        "cluster": cluster,
        "lb": cluster_report(cluster),
        "members": cluster.members.select_related("server"),
        "locked": services.membership_locked(cluster),
        "algorithms": Algorithm.choices,
        # Only servers that can serve: running or starting, and not a member of any cluster already.
        "servers": ModelServer.objects.filter(
            cluster_member__isnull=True, state__in=(ServerState.RUNNING, ServerState.STARTING)
        ).order_by("name"),
        "active_nav": "clusters",
    }
    return render(request, "clusters/cluster_detail.html", context)


def _save(request: HttpRequest, serializer: Any, done: str, write: Any = None) -> Any:
    """Validate through the API's serializer, then save it (or hand its validated data to ``write``, an
    operator rule of apps.clusters.services); flash the outcome with the API's codes."""
    if not serializer.is_valid():
        messages.error(request, f"VALIDATION_ERROR: {describe_validation(serializer.errors)}")
        return None
    try:
        saved = serializer.save() if write is None else write(dict(serializer.validated_data))
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
        return None
    messages.success(request, done.format(saved))
    return saved


def _post(request: HttpRequest, *names: str) -> dict[str, Any]:
    """The named form fields; empty ones left out, so the serializer's defaults apply."""
    return {name: request.POST[name] for name in names if request.POST.get(name, "") != ""}


@staff_required
@require_POST
def cluster_create(request: HttpRequest) -> HttpResponse:
    from apps.clusters.api.serializers import ClusterCreateSerializer

    data: dict[str, Any] = _post(request, "name", "algorithm")
    if request.POST.getlist("servers"):
        data["servers"] = request.POST.getlist("servers")
    serializer = ClusterCreateSerializer(data=data)
    cluster = _save(request, serializer, "Cluster {} created.")
    return redirect("clusters:detail", cluster.pk) if cluster else redirect("clusters:list")


@staff_required
@require_POST
def cluster_algorithm(request: HttpRequest, pk: int) -> HttpResponse:
    """The algorithm is a runtime router knob: accepted with servers attached."""
    from apps.clusters.api.serializers import ClusterSerializer

    cluster = get_object_or_404(Cluster, pk=pk)
    serializer = ClusterSerializer(cluster, data=_post(request, "algorithm"), partial=True)
    _save(request, serializer, "Cluster {} now routes by its new algorithm.")
    return redirect("clusters:detail", pk)


@staff_required
@require_POST
def member_add(request: HttpRequest, pk: int) -> HttpResponse:
    from apps.clusters.api.serializers import ClusterMemberSerializer

    cluster = get_object_or_404(Cluster, pk=pk)
    data = {"cluster": cluster.pk, **_post(request, "name", "gpus", "weight")}

    def add(fields: dict[str, Any]) -> ClusterMember:
        return services.add_member(fields.pop("cluster"), **fields)

    _save(request, ClusterMemberSerializer(data=data), "Member {} added.", write=add)
    return redirect("clusters:detail", pk)


@staff_required
@require_POST
def member_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Weight, GPUs or name: membership, refused while the cluster has servers attached."""
    from apps.clusters.api.serializers import ClusterMemberSerializer

    member = get_object_or_404(ClusterMember.objects.select_related("cluster"), pk=pk)
    serializer = ClusterMemberSerializer(member, data=_post(request, "name", "gpus", "weight"), partial=True)
    _save(
        request, serializer, "Member {} changed.", write=lambda fields: services.edit_member(member, **fields)
    )
    return redirect("clusters:detail", member.cluster_id)


@staff_required
@require_POST
def member_remove(request: HttpRequest, pk: int) -> HttpResponse:
    member = get_object_or_404(ClusterMember.objects.select_related("cluster"), pk=pk)
    try:
        services.remove_member(member)
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    else:
        messages.success(request, f"Member {member.name} removed.")
    return redirect("clusters:detail", member.cluster_id)


@staff_required
@require_POST
def member_attach(request: HttpRequest, pk: int) -> HttpResponse:
    member = get_object_or_404(ClusterMember, pk=pk)
    server = by_pk(ModelServer.objects.all(), request.POST.get("server"))
    if server is None:
        messages.error(request, "VALIDATION_ERROR: server: choose an existing model server.")
        return redirect("clusters:detail", member.cluster_id)
    try:
        services.attach(member, server)
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    else:
        messages.success(request, f"{server.name} attached to {member.name}.")
    return redirect("clusters:detail", member.cluster_id)


@staff_required
@require_POST
def member_detach(request: HttpRequest, pk: int) -> HttpResponse:
    member = get_object_or_404(ClusterMember, pk=pk)
    services.detach(member)
    messages.success(request, f"Server detached from {member.name}.")
    return redirect("clusters:detail", member.cluster_id)


@staff_required
@require_POST
def capability_create(request: HttpRequest) -> HttpResponse:
    from apps.clusters.api.serializers import CapabilitySerializer

    # Not stripped: a capability is written exactly (" rag.embedding@1" is refused, never trimmed).
    data = {"name": request.POST.get("name", ""), "description": request.POST.get("description", "")}
    _save(request, CapabilitySerializer(data=data), "Capability {} created.")
    return redirect("clusters:list")


@staff_required
@require_POST
def tier_create(request: HttpRequest) -> HttpResponse:
    from apps.clusters.api.serializers import RoutingTierSerializer

    data = _post(request, "capability", "tier", "cluster", "server", "weight", "project")
    _save(request, RoutingTierSerializer(data=data), "Routing tier added: {}.")
    return redirect("clusters:list")


@staff_required
@require_POST
def tier_remove(request: HttpRequest, pk: int) -> HttpResponse:
    tier = get_object_or_404(RoutingTier, pk=pk)
    tier.delete()
    messages.success(request, f"Routing tier removed: {tier}.")
    return redirect("clusters:list")


@staff_required
def playground_page(request: HttpRequest) -> HttpResponse:
    """The Playground: a chat, completion or embeddings request to a capability, sent from the browser to
    the gateway with a short-lived playground credential (apps/clusters/playground.py)."""
    offers = playground.offers()
    context = {
        "offers": offers,
        "offers_json": {o.name: o.as_json() for o in offers},
        "lifetime_minutes": int(playground.LIFETIME.total_seconds() // 60),
        "active_nav": "playground",
    }
    return render(request, "clusters/playground.html", context)


@require_POST
def playground_credential(request: HttpRequest) -> HttpResponse:
    """``POST`` ``capability`` (and ``project``): the session's playground credential for exactly that,
    as JSON; refusals in the envelope (the page shows the code and the message)."""
    user = request.user
    if not user.is_authenticated:
        return envelope_response(
            error_codes.NOT_AUTHENTICATED, "Log in to the dashboard to use the Playground.", 401
        )
    if not (user.is_active and user.is_staff):
        return envelope_response(
            error_codes.PERMISSION_DENIED, "The Playground is for operators (staff accounts).", 403
        )
    capability = request.POST.get("capability", "")
    project = request.POST.get("project", "")
    offer = next((o for o in playground.offers() if o.name == capability), None)
    if offer is None:
        return envelope_response(
            error_codes.VALIDATION_ERROR, f"capability: no capability is named {capability[:80]!r}.", 400
        )
    if project not in offer.projects:
        named = ", ".join(p for p in offer.projects if p)
        unbound = "no project" if "" in offer.projects else ""
        bound = " and ".join(part for part in (unbound, named and f"projects {named}") if part)
        return envelope_response(
            error_codes.VALIDATION_ERROR,
            f"project: the routing tiers of {capability} are bound for {bound}, not {project[:63]!r}.",
            400,
        )
    minted = playground.credential_for(request.session, user, capability, project)
    return JsonResponse(minted.as_json(), status=200 if minted.reused else 201)
