from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from apps.nodes.models import Node
from apps.observability import codes, sampling, usage
from apps.observability.models import HostSample, TelemetrySample, TrafficSample
from modelforge.csvexport import write_table
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


class UsageCSVRenderer(BaseRenderer):
    """``?format=csv``: the rows as CSV, one line per period and group, the columns of the JSON rows."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        # Names are operator text: written formula-safe (modelforge.csvexport), as every CSV export is.
        out = io.StringIO()
        if isinstance(data, dict) and "rows" in data:
            write_table(out, usage.COLUMNS, data["rows"])
        else:  # a refusal: the envelope's fields as one row
            items = dict(data) if isinstance(data, dict) else {"message": str(data)}
            write_table(out, list(items), [items])
        return out.getvalue().encode()


_GROUP = "(" + "|".join(usage.GROUPS) + ")"
GROUP_BY_PATTERN = rf"^{_GROUP}(,{_GROUP})*$"


class UsageQuerySerializer(serializers.Serializer):
    days = serializers.IntegerField(min_value=1, max_value=3650, default=1, help_text="How far back.")
    granularity = serializers.ChoiceField(choices=list(usage.GRANULARITIES), default="hour")
    group_by = serializers.RegexField(
        GROUP_BY_PATTERN,
        default="credential,capability",
        max_length=200,
        help_text="Comma-separated, any of: " + ", ".join(usage.GROUPS) + ".",
        error_messages={"invalid": "group_by takes a comma-separated list of " + ", ".join(usage.GROUPS)},
    )
    credential = serializers.CharField(max_length=64, required=False)
    project = serializers.CharField(max_length=63, required=False)
    capability = serializers.CharField(max_length=80, required=False)
    backend = serializers.CharField(max_length=200, required=False)

    def validate_group_by(self, value: str) -> tuple[str, ...]:
        groups = tuple(part.strip() for part in value.split(",") if part.strip())
        unknown = [g for g in groups if g not in usage.GROUPS]
        if unknown or not groups:
            raise serializers.ValidationError(
                f"group_by takes a comma-separated list of {', '.join(usage.GROUPS)}"
                + (f"; not {', '.join(unknown)}" if unknown else "")
            )
        return tuple(dict.fromkeys(groups))


class UsageRowSerializer(serializers.Serializer):
    period = serializers.DateTimeField()
    credential = serializers.CharField(allow_null=True)
    credential_name = serializers.CharField(allow_null=True)
    project = serializers.CharField(allow_null=True)
    capability = serializers.CharField(allow_null=True)
    backend = serializers.CharField(allow_null=True)
    requests = serializers.IntegerField()
    unmetered = serializers.IntegerField(help_text="Answers whose engine reported no token usage.")
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    ttft_ms_avg = serializers.FloatField(allow_null=True, help_text="Streamed answers only.")
    latency_ms_avg = serializers.FloatField(allow_null=True)

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["errors"] = serializers.IntegerField()  # a Serializer's own attribute: declared here
        return fields


class UsageSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    granularity = serializers.CharField()
    group_by = serializers.ListField(child=serializers.CharField())
    rows = UsageRowSerializer(many=True)


class UsageView(APIView):
    """Usage through the gateway per credential, project, capability and backend: requests, errors,
    prompt and completion tokens (the engines' own counts), average time to first token (streams) and
    total time, per minute, hour or day (``granularity``) over the last ``days``, grouped by
    ``group_by``. ``?format=csv`` exports the same rows. A minute appears about a minute after it ends
    (rolled up by the sampling task). ``503 OBSERVABILITY_DEGRADED`` when the monitoring store is
    unavailable; serving does not depend on it."""

    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, UsageCSVRenderer]  # type: ignore[list-item]

    @extend_schema(parameters=[UsageQuerySerializer], responses=UsageSerializer)
    def get(self, request: Request) -> Response:
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        given = query.validated_data
        since = timezone.now() - timedelta(days=given["days"])
        filters = {k: given[k] for k in usage.GROUPS if k in given}
        try:
            rows = usage.usage_rows(
                since, granularity=given["granularity"], group_by=given["group_by"], filters=filters
            )
        except sampling.ObservabilityUnavailable as exc:
            raise ApiError(
                codes.OBSERVABILITY_DEGRADED,
                f"Monitoring persistence is unavailable ({exc}); usage cannot be read. Serving goes on and "
                "usage is kept in Redis for a day, rolled up when the store is back.",
                503,
            ) from None
        payload = {
            "since": since,
            "granularity": given["granularity"],
            "group_by": list(given["group_by"]),
            "rows": UsageRowSerializer(rows, many=True).data,
        }
        return Response(payload)
