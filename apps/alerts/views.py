from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.alerts import codes
from apps.alerts.filtersets import AlertFilterSet
from apps.alerts.models import Alert
from modelforge.errors import describe_validation
from modelforge.filters import filtered


@staff_member_required(login_url="dashboard:login")
def alert_list(request: HttpRequest) -> HttpResponse:
    data = request.GET.copy()
    if "open" not in data:
        data["open"] = "true"
    filterset = AlertFilterSet(data, queryset=Alert.objects.all())
    page = Paginator(filtered(filterset), 50).get_page(request.GET.get("page"))
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


@staff_member_required(login_url="dashboard:login")
def channel_list(request: HttpRequest) -> HttpResponse:
    from apps.alerts.choices import ChannelKind, Severity
    from apps.alerts.models import Notification, NotificationChannel

    context = {
        "channels": NotificationChannel.objects.all(),
        "recent": Notification.objects.select_related("channel", "alert").exclude(state="sent")[:50],
        "kinds": ChannelKind.choices,
        "severities": Severity.choices,
        "email_configured": bool(settings.EMAIL_URL),
        "interval": settings.NOTIFY_INTERVAL,
        "active_nav": "alerts",
    }
    return render(request, "alerts/channel_list.html", context)


@staff_member_required(login_url="dashboard:login")
@require_POST
def channel_create(request: HttpRequest) -> HttpResponse:
    from apps.alerts.api.serializers import NotificationChannelSerializer

    fields = ("name", "kind", "target", "secret", "min_severity")
    serializer = NotificationChannelSerializer(data={k: request.POST[k] for k in fields if k in request.POST})
    if serializer.is_valid():
        channel = serializer.save(created_by=request.user.get_username())
        messages.success(request, f"Channel {channel.name} created; send it a test message.")
    else:
        messages.error(request, f"VALIDATION_ERROR: {describe_validation(serializer.errors)}")
    return redirect("alerts:channels")


@staff_member_required(login_url="dashboard:login")
@require_POST
def channel_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    from apps.alerts import notify
    from apps.alerts.models import NotificationChannel

    channel = get_object_or_404(NotificationChannel, pk=pk)
    if action == "test":
        try:
            notify.send_test(channel)
        except notify.DeliveryFailed as exc:
            messages.error(request, f"{codes.NOTIFICATION_FAILED}: channel {channel.name}: {exc}")
        else:
            messages.success(request, f"Test message delivered through {channel.name}.")
    elif action in ("enable", "disable"):
        channel.enabled = action == "enable"
        channel.save(update_fields=["enabled"])
        messages.success(request, f"Channel {channel.name} {action}d.")
    elif action == "delete":
        channel.delete()
        messages.success(request, f"Channel {channel.name} deleted.")
    else:
        messages.error(request, f"VALIDATION_ERROR: unknown action {action!r}.")
    return redirect("alerts:channels")
