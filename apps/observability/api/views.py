from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.nodes.models import Node
from apps.observability import codes, sampling
from apps.observability.models import HostSample, TelemetrySample, TrafficSample
from modelforge.errors import ApiError
from modelforge.openapi import NOT_BLANK


class TelemetrySampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = TelemetrySample
        fields = [
            "gpu_index",
            "at",
            "reported_at",
            "memory_total_bytes",
            "memory_used_bytes",
            "memory_managed_bytes",
            "utilization_percent",
            "temperature_c",
        ]


# The query's bounds, as the schema states them (MinutesSerializer and TrafficQuerySerializer check them).
MINUTES = {"type": "integer", "minimum": 1, "maximum": 7 * 24 * 60}
BACKEND = {"type": "string", "maxLength": 64, "pattern": NOT_BLANK}


class HostSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = HostSample
        fields = ["at", "reported_at", "memory_total_bytes", "memory_available_bytes", "load_1m", "cpu_count"]


class NodeTelemetrySerializer(serializers.Serializer):
    node = serializers.UUIDField()
    node_name = serializers.CharField()
    since = serializers.DateTimeField()
    samples = TelemetrySampleSerializer(many=True)
    host_samples = HostSampleSerializer(
        many=True, help_text="RAM and load over the same window: the only history a CPU node has."
    )


class MinutesSerializer(serializers.Serializer):
    minutes = serializers.IntegerField(min_value=1, max_value=7 * 24 * 60, default=60)


class NodeTelemetryView(APIView):
    """A node's telemetry history (``minutes``, default 60): GPU samples, and host samples (RAM, load).
    ``503 OBSERVABILITY_DEGRADED`` when the monitoring store is unavailable; nothing else depends on it."""

    @extend_schema(
        parameters=[
            OpenApiParameter("minutes", MINUTES, description="How far back, 1 to 10080 (default 60).")
        ],
        responses=NodeTelemetrySerializer,
    )
    def get(self, request: Request, pk: Any) -> Response:
        node = get_object_or_404(Node, pk=pk)
        query = MinutesSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        since = timezone.now() - timedelta(minutes=query.validated_data["minutes"])
        try:
            samples = sampling.history(node.pk, since)
            hosts = sampling.host_history(node.pk, since)
        except sampling.ObservabilityUnavailable as exc:
            raise ApiError(
                codes.OBSERVABILITY_DEGRADED,
                f"Monitoring persistence is unavailable ({exc}); telemetry history cannot be read. "
                "The node's current reading is in GET /api/v1/nodes/{id}.",
                503,
            ) from None
        return Response(
            {
                "node": str(node.pk),
                "node_name": node.name,
                "since": since,
                "samples": TelemetrySampleSerializer(samples, many=True).data,
                "host_samples": HostSampleSerializer(hosts, many=True).data,
            }
        )


class TrafficSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrafficSample
        fields = ["backend", "minute", "requests", "errors"]


class TrafficSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    samples = TrafficSampleSerializer(many=True)


class TrafficQuerySerializer(MinutesSerializer):
    backend = serializers.CharField(max_length=64, required=False)


class TrafficView(APIView):
    """Requests and errors per backend (model server id) per minute through the gateway, newest first
    (``minutes``, default 60; ``backend`` to pick one). ``503 OBSERVABILITY_DEGRADED`` when the monitoring
    store is unavailable."""

    @extend_schema(
        parameters=[
            OpenApiParameter("minutes", MINUTES, description="How far back, 1 to 10080 (default 60)."),
            OpenApiParameter("backend", BACKEND, description="One model server's id."),
        ],
        responses=TrafficSerializer,
    )
    def get(self, request: Request) -> Response:
        query = TrafficQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        since = timezone.now() - timedelta(minutes=query.validated_data["minutes"])
        try:
            rows = sampling.traffic(since, query.validated_data.get("backend"))
        except sampling.ObservabilityUnavailable as exc:
            raise ApiError(
                codes.OBSERVABILITY_DEGRADED,
                f"Monitoring persistence is unavailable ({exc}); traffic history cannot be read. "
                "The last minutes are on each cluster's load-balancer card.",
                503,
            ) from None
        return Response({"since": since, "samples": TrafficSampleSerializer(rows, many=True).data})
