"""Dashboard pages of embedding migrations: cutovers with their progress, the store as read now, the
actions (start, cut over, complete, roll back, retry), and planning a cutover for an alias."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.clusters.models import Capability
from apps.embedding_migrations import engine
from apps.embedding_migrations.choices import Stage
from apps.embedding_migrations.filtersets import CutoverFilterSet
from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace, VectorStore
from modelforge.errors import ApiError
from modelforge.filters import filtered
from modelforge.validators import checked_text

staff_required: Any = staff_member_required(login_url="dashboard:login")

ACTIONS: dict[str, tuple[Callable[..., Cutover], bool]] = {
    "start": (engine.start, False),
    "cut": (engine.cut, False),
    "complete": (engine.complete, True),
    "roll-back": (engine.roll_back, True),
    "retry": (engine.retry, True),
}


@staff_required
def cutover_list(request: HttpRequest) -> HttpResponse:
    stage = request.GET.get("stage", "")
    filterset = CutoverFilterSet(
        request.GET,
        queryset=Cutover.objects.select_related("alias__store", "source_capability", "target_capability"),
    )
    context = {
        "filter": filterset,
        "page": Paginator(filtered(filterset), 50).get_page(request.GET.get("page")),
        "stage": stage,
        "stages": Stage.choices,
        "aliases": ConsumerAlias.objects.select_related("store", "capability", "query_capability"),
        "stores": VectorStore.objects.all(),
        "spaces": EmbeddingSpace.objects.select_related("capability"),
        "targets": Capability.objects.filter(follows__isnull=True, embedding_space__isnull=False),
        "active_nav": "migrations",
    }
    return render(request, "embedding_migrations/cutover_list.html", context)


@staff_required
def cutover_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    cutover = get_object_or_404(
        Cutover.objects.select_related("alias__store", "source_capability", "target_capability"), pk=pk
    )
    context = {
        "cutover": cutover,
        "events": cutover.events.all(),
        "reading": engine.store_reading(cutover),
        "checks": cutover.verification.get("checks", {}),
        "active_nav": "migrations",
    }
    return render(request, "embedding_migrations/cutover_detail.html", context)


@staff_required
@require_POST
def plan_cutover(request: HttpRequest) -> HttpResponse:
    raw_alias = request.POST.get("alias", "")
    alias = ConsumerAlias.objects.filter(pk=int(raw_alias)).first() if raw_alias.isdigit() else None
    target = Capability.objects.filter(name=request.POST.get("target_capability", "")).first()
    if alias is None or target is None:
        messages.error(request, "VALIDATION_ERROR: choose an alias and a target capability.")
        return redirect("migrations:list")
    try:
        cutover = engine.plan(alias=alias, target=target, actor=request.user.get_username())
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
        return redirect("migrations:list")
    messages.info(request, "Planned. Start it to provision, reindex and verify.")
    return redirect("migrations:detail", pk=cutover.pk)


@staff_required
@require_POST
def cutover_action(request: HttpRequest, pk: Any, action: str) -> HttpResponse:
    cutover = get_object_or_404(Cutover, pk=pk)
    if action not in ACTIONS:
        messages.error(request, f"VALIDATION_ERROR: no action {action!r}.")
        return redirect("migrations:detail", pk=cutover.pk)
    verb, needs_reason = ACTIONS[action]
    try:
        reason = checked_text("reason", request.POST.get("reason", "")[:2000], lines=True)
        if needs_reason and not reason.strip():
            raise ApiError("VALIDATION_ERROR", "reason: say why (it is recorded with your name).", 400)
        verb(cutover.pk, actor=request.user.get_username(), reason=reason or action.replace("-", " "))
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    else:
        messages.info(request, f"{action.replace('-', ' ').capitalize()}: recorded.")
    return redirect("migrations:detail", pk=cutover.pk)
