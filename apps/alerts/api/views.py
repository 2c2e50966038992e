from rest_framework import viewsets

from apps.alerts.api.serializers import AlertSerializer
from apps.alerts.filtersets import AlertFilterSet
from apps.alerts.models import Alert


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Alerts, newest first; filter by code, severity, subject and open/cleared."""

    queryset = Alert.objects.all()
    serializer_class = AlertSerializer
    filterset_class = AlertFilterSet
