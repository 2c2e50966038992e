"""``/metrics`` for Prometheus: the platform's state, computed when scraped.

A collector reads authoritative state and the load balancer's shared Redis state at scrape time, so
every web process answers the same and no multiprocess bookkeeping is needed. The collectors are the
apps' own (``register``): nodes, model servers, open alerts, the load balancer. Operator access (the
operator API key as a Bearer token, or a staff session).
"""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.registry import Collector
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

# Each app contributes the collectors for its own state at ``AppConfig.ready()`` (its ``contributions``
# module): the kernel serves them and names no app.
registry = CollectorRegistry(auto_describe=False)


def register(collector: Collector) -> None:
    """Add an app's collector to ``/metrics``; called once per process, from the app's ``ready()``."""
    registry.register(collector)


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
