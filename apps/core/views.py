"""The dashboard shell: staff login, the home page, and the Work page (rows waiting on background work)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Max
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.core import registry, work, work_actions
from apps.core.status import system_status
from modelforge.errors import ApiError, codes, describe_validation


class StaffAuthenticationForm(AuthenticationForm):
    """Only staff users operate ModelForge; others are told so instead of being let in."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if not user.is_staff:
            raise forms.ValidationError("This account is not an operator (staff) account.", code="not_staff")


class LoginView(auth_views.LoginView):
    template_name = "core/login.html"
    authentication_form = StaffAuthenticationForm
    redirect_authenticated_user = True


def login_locked_out(
    request: HttpRequest, original_response: Any = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """django-axes' ``AXES_LOCKOUT_CALLABLE``: what a locked-out log-in (dashboard or admin) is shown.

    A page (200) that explains the refusal, as every dashboard refusal is, not an error response for the
    envelope to replace. The lock ends a cool-off after the last counted failure: attempts refused while
    locked are not counted (``AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT``), so the time given holds."""
    from axes.helpers import get_client_username
    from axes.models import AccessAttempt

    credentials = credentials or getattr(request, "axes_credentials", None)
    username = get_client_username(request, credentials) or ""
    address = getattr(request, "axes_ip_address", None) or request.META.get("REMOTE_ADDR") or ""
    last = AccessAttempt.objects.filter(username=username, ip_address=address or None).aggregate(
        last=Max("attempt_time")
    )["last"]
    now = timezone.now()
    until = (last or now) + timedelta(seconds=settings.LOGIN_COOLOFF)
    context = {
        "code": codes.LOGIN_LOCKED_OUT,
        "username": username,
        "address": address,
        "limit": settings.LOGIN_FAILURE_LIMIT,
        "until": until,
        "minutes": max(1, math.ceil((until - now).total_seconds() / 60)),
        "login_url": request.path,
    }
    return render(request, "core/login_locked.html", context)


def _staff_required(view):
    return staff_member_required(view, login_url="dashboard:login")


@_staff_required
def home(request: HttpRequest) -> HttpResponse:
    from apps.core.invariants import check_live
    from apps.core.outages import recent_outages

    # The top of the dashboard: each domain's summary is a card its app registered (apps.core.registry).
    cards = sorted(registry.overview_cards, key=lambda card: card.position)
    context = {
        "status": system_status(),
        "active_nav": "home",
        "cards": [{"template": card.template, "context": card.context()} for card in cards],
        "invariants": check_live(),
        "work": _work_counts(),
        "outages": recent_outages(),
    }
    return render(request, "core/home.html", context)


def _work_counts() -> dict[str, int]:
    now = timezone.now()
    rows = work.waiting(now)
    return {"waiting": len(rows), "stuck": sum(1 for item in rows if item.age(now) > item.stuck_after)}


# The page of each kind's row on the dashboard (a replica is shown on its artifact's page).
WORK_PAGES: dict[str, tuple[str, str]] = {
    "backup": ("backups:detail", "pk"),
    "restore": ("backups:restore", "pk"),
    "server": ("servers:detail", "pk"),
    "artifact": ("artifacts:detail", "pk"),
    "replica": ("artifacts:detail", "artifact_id"),
}


def _work_page(item: work.Waiting) -> str:
    page = WORK_PAGES.get(item.kind)
    return reverse(page[0], args=[getattr(item.row, page[1])]) if page else ""


@_staff_required
def work_list(request: HttpRequest) -> HttpResponse:
    """Rows waiting on background work, with their bound, and the operator's two answers to each."""
    from apps.core.api.serializers import WorkFilterSerializer

    now = timezone.now()
    # The form's "any" is an empty value; the API has no such value (its schema lists the kinds).
    filters = WorkFilterSerializer(data={k: v for k, v in request.GET.dict().items() if v != ""})
    rows: list[dict[str, Any]] = []
    if filters.is_valid():
        rows = [{**item.as_dict(now), "url": _work_page(item)} for item in filters.rows(now)]
    else:
        # Shown, not guessed around: an unreadable filter lists nothing rather than everything.
        messages.error(request, f"{codes.VALIDATION_ERROR}: {describe_validation(filters.errors)}")
    context = {
        "rows": rows,
        "kinds": [(kind.name, kind.label) for kind in work.KINDS.values()],
        "kind": request.GET.get("kind", ""),
        "stuck": request.GET.get("stuck", ""),
        "resend_after": settings.WORK_RESEND_AFTER,
        "active_nav": "work",
    }
    return render(request, "core/work.html", context)


@_staff_required
@require_POST
def work_action(request: HttpRequest, kind: str, pk: str, action: str) -> HttpResponse:
    """Retry or mark failed, then back to the page it came from; a refusal is a message with its code."""
    by = request.user.get_username()
    try:
        if action == "retry":
            messages.success(request, work_actions.retried_message(work.retry(kind, pk, by)))
        else:
            messages.success(request, work_actions.failed_message(work_actions.mark_failed(kind, pk, by)))
    except ApiError as exc:
        messages.error(request, f"{exc.code}: {exc.message}")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, require_https=request.is_secure()):
        back = reverse("dashboard:work")
    return redirect(back)
