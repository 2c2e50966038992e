from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.alerts.filtersets import AlertFilterSet
from apps.alerts.models import Alert


@staff_member_required(login_url="dashboard:login")
def alert_list(request: HttpRequest) -> HttpResponse:
    data = request.GET.copy()
    if "open" not in data:
        data["open"] = "true"
    filterset = AlertFilterSet(data, queryset=Alert.objects.all())
    page = Paginator(filterset.qs, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "alerts/alert_list.html",
        {
            "filter": filterset,
            "page": page,
            "active_nav": "alerts",
            "showing_open": data.get("open") == "true",
        },
    )
