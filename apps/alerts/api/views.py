from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.alerts import codes, notify
from apps.alerts.api.serializers import AlertSerializer, NotificationChannelSerializer, NotificationSerializer
from apps.alerts.filtersets import AlertFilterSet
from apps.alerts.models import Alert, Notification, NotificationChannel
from modelforge.errors import ApiError
from modelforge.openapi import error_response


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Alerts, newest first; filter by code, severity, subject and open/cleared."""

    queryset = Alert.objects.all()
    serializer_class = AlertSerializer
    filterset_class = AlertFilterSet


class NotificationChannelViewSet(viewsets.ModelViewSet):
    """Where alert events are sent: webhooks and e-mail. ``test`` sends one message now."""

    queryset = NotificationChannel.objects.all()
    serializer_class = NotificationChannelSerializer
    filterset_fields = ["kind", "enabled"]

    def perform_create(self, serializer: Any) -> None:
        serializer.save(created_by=str(getattr(self.request.user, "username", self.request.user)))

    @extend_schema(
        request=None,
        responses={
            200: NotificationChannelSerializer,
            502: error_response("NOTIFICATION_FAILED: the channel did not take the test message."),
        },
    )
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: Any = None) -> Response:
        channel = self.get_object()
        try:
            notify.send_test(channel)
        except notify.DeliveryFailed as exc:
            raise ApiError(codes.NOTIFICATION_FAILED, f"Channel {channel.name}: {exc}", 502) from None
        channel.refresh_from_db()
        return Response(NotificationChannelSerializer(channel).data)


class NotificationViewSet(viewsets.ReadOnlyModelViewSet):
    """Alert events per channel: pending, sent, or failed (given up after the last attempt)."""

    queryset = Notification.objects.select_related("channel", "alert")
    serializer_class = NotificationSerializer
    filterset_fields = ["channel", "state", "event"]
