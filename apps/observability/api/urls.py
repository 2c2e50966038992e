from django.urls import path

from apps.observability.api.views import NodeTelemetryView

urlpatterns = [path("nodes/<uuid:pk>/telemetry", NodeTelemetryView.as_view(), name="node-telemetry")]
