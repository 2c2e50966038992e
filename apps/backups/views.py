"""Dashboard pages for backups: the RPO exposure and staleness, the list with a "Back up now" button,
a backup's manifest and verification, and restores with their phases and the review actions."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.alerts.models import Alert
from apps.backups import codes, restore, services, snapshot
from apps.backups.filtersets import BackupFilterSet
from apps.backups.models import Backup, Restore
from apps.backups.tasks import run_restore, take_backup
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError
from modelforge.filters import filtered
from modelforge.validators import checked_text

staff_required: Any = staff_member_required(login_url="dashboard:login")


@staff_required
def backup_list(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    filterset = BackupFilterSet(request.GET, queryset=Backup.objects.all())
    context = {
        "filter": filterset,
        "page": Paginator(filtered(filterset), 50).get_page(request.GET.get("page")),
        "state": state,
        "newest": Backup.objects.newest_verified(),
        "rpo_exposure": snapshot.rpo_exposure(),
        "stale_after": settings.BACKUP_STALE_AFTER,
        "stale_alert": Alert.objects.open().filter(code=codes.BACKUP_STALE).first(),
        "awaiting_review": Restore.objects.filter(needs_review=True).first(),
        "restores": Restore.objects.select_related("backup")[:10],
        "backup_root": settings.BACKUP_ROOT,
        "active_nav": "backups",
    }
    return render(request, "backups/backup_list.html", context)


@staff_required
def backup_detail(request: HttpRequest, pk: int) -> HttpResponse:
    backup = get_object_or_404(Backup, pk=pk)
    context = {"backup": backup, "events": backup.events.all()[:50], "active_nav": "backups"}
    return render(request, "backups/backup_detail.html", context)


@staff_required
def restore_detail(request: HttpRequest, pk: int) -> HttpResponse:
    found = get_object_or_404(Restore.objects.select_related("backup"), pk=pk)
    context = {"restore": found, "phases": found.phases.all(), "active_nav": "backups"}
    return render(request, "backups/restore_detail.html", context)


@staff_required
@require_POST
def backup_now(request: HttpRequest) -> HttpResponse:
    try:
        backup = snapshot.request_backup(trigger="operator", by=request.user.get_username())
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
        return redirect("backups:list")
    send_on_commit(take_backup, backup.pk)
    messages.info(request, f"Backup #{backup.pk} queued; verification follows automatically.")
    return redirect("backups:detail", pk=backup.pk)


@staff_required
@require_POST
def backup_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    backup = get_object_or_404(Backup, pk=pk)
    try:
        if action == "verify":
            if services.request_verification(backup):
                messages.info(request, f"Verifying backup #{backup.pk} again.")
            else:
                nothing = f"Backup #{backup.pk} is {backup.state}: there is nothing to verify."
                messages.warning(request, nothing)
        elif action == "restore":
            reason = checked_text("reason", request.POST.get("reason", ""), lines=True)
            queued = restore.request_restore(backup, by=request.user.get_username(), reason=reason)
            send_on_commit(run_restore, queued.pk)
            messages.warning(request, f"Restore #{queued.pk} of backup #{backup.pk} queued.")
            return redirect("backups:restore", pk=queued.pk)
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    return redirect("backups:detail", pk=backup.pk)


@staff_required
@require_POST
def restore_review(request: HttpRequest, pk: int, decision: str) -> HttpResponse:
    found = get_object_or_404(Restore, pk=pk)
    try:
        note = checked_text("reason", request.POST.get("reason", ""), lines=True)
        restore.review(found, decision=decision, by=request.user.get_username(), note=note)
        messages.success(request, f"Restore #{found.pk}: {decision} recorded.")
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    return redirect("backups:restore", pk=found.pk)
