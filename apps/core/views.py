"""The dashboard shell: staff login and the home page."""

from __future__ import annotations

from django import forms
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.core.status import system_status


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


def _staff_required(view):
    return staff_member_required(view, login_url="dashboard:login")


@_staff_required
def home(request: HttpRequest) -> HttpResponse:
    from django.db.models import Count

    from apps.alerts.models import Alert
    from apps.core.invariants import check_live
    from apps.nodes.models import Node
    from apps.servers.models import ModelServer

    # The overview is the top of the dashboard: it may read every domain's summary.
    liveness = dict(Node.objects.values_list("liveness").annotate(n=Count("pk")).values_list("liveness", "n"))
    context = {
        "status": system_status(),
        "active_nav": "home",
        "liveness": liveness,
        "assignable": Node.objects.assignable().count(),
        "open_alerts": Alert.objects.open().values("severity").annotate(n=Count("pk")).order_by("severity"),
        "servers": dict(
            ModelServer.objects.values_list("state").annotate(n=Count("pk")).values_list("state", "n")
        ),
        "invariants": check_live(),
    }
    return render(request, "core/home.html", context)
