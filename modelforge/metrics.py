"""``/metrics`` for Prometheus: the platform's state, computed when scraped.

A collector reads authoritative state and the load balancer's shared Redis state at scrape time, so
every web process answers the same and no multiprocess bookkeeping is needed. Operator access (the
operator API key as a Bearer token, or a staff session).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.views import APIView


class PlatformCollector(Collector):
    def collect(self) -> Iterator[Any]:
        from apps.alerts.models import Alert
        from apps.gateway.lbstate import read_bench_and_traffic
        from apps.nodes.models import Node
        from apps.servers.models import ModelServer

        nodes = GaugeMetricFamily("modelforge_nodes", "Enrolled nodes by liveness.", labels=["liveness"])
        for liveness, count in Node.objects.values_list("liveness").annotate(n=Count("pk")):
            nodes.add_metric([liveness], count)
        yield nodes
        servers = GaugeMetricFamily("modelforge_model_servers", "Model servers by state.", labels=["state"])
        for state, count in ModelServer.objects.values_list("state").annotate(n=Count("pk")):
            servers.add_metric([state], count)
        yield servers
        alerts = GaugeMetricFamily(
            "modelforge_alerts_open", "Open alerts by code and severity.", labels=["code", "severity"]
        )
        for code, severity, count in (
            Alert.objects.open().values_list("code", "severity").annotate(n=Count("pk"))
        ):
            alerts.add_metric([code, severity], count)
        yield alerts
        benched, traffic, errors, redis_ok = read_bench_and_traffic(5)
        yield GaugeMetricFamily(
            "modelforge_lb_redis_reachable",
            "1 when the load balancer's shared state in Redis is reachable; 0: each process routes alone.",
            value=1 if redis_ok else 0,
        )
        yield GaugeMetricFamily(
            "modelforge_lb_benched_backends", "Backends on the sin-bin now.", value=len(benched)
        )
        requests = GaugeMetricFamily(
            "modelforge_lb_requests_5m", "Requests per backend, last 5 minutes.", labels=["backend"]
        )
        failures = GaugeMetricFamily(
            "modelforge_lb_failures_5m", "Failed requests per backend, last 5 minutes.", labels=["backend"]
        )
        for backend, count in traffic.items():
            requests.add_metric([backend], count)
        for backend, count in errors.items():
            failures.add_metric([backend], count)
        yield requests
        yield failures


registry = CollectorRegistry(auto_describe=False)
registry.register(PlatformCollector())


class PrometheusRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"


class MetricsView(APIView):
    """The platform's state in Prometheus's text format; GET and HEAD only."""

    # Not ``@api_view``: that always adds OPTIONS, whose metadata answer the Prometheus renderer cannot
    # render (it was a 500). Any method not named here is the 405 envelope with ``Allow: GET, HEAD``.
    renderer_classes = [PrometheusRenderer]
    http_method_names = ["get", "head"]

    @extend_schema(responses={(200, CONTENT_TYPE_LATEST): OpenApiTypes.STR}, summary="Prometheus metrics")
    def get(self, request: Request) -> HttpResponse:
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


metrics = MetricsView.as_view()
