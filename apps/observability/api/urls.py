from django.urls import path

from apps.observability.api.views import NodeTelemetryView, TrafficView, UsageView

urlpatterns = [
    path("nodes/<uuid:pk>/telemetry", NodeTelemetryView.as_view(), name="node-telemetry"),
    path("traffic", TrafficView.as_view(), name="traffic"),
    path("usage", UsageView.as_view(), name="usage"),
]
