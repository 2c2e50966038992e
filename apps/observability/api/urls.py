from django.urls import path

from apps.observability.api.views import NodeTelemetryView, TrafficView

urlpatterns = [
    path("nodes/<uuid:pk>/telemetry", NodeTelemetryView.as_view(), name="node-telemetry"),
    path("traffic", TrafficView.as_view(), name="traffic"),
]
