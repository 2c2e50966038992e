"""Unauthenticated probes for process supervisors and load balancers."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from apps.core.status import probe_broker, probe_database
from modelforge.errors import codes, envelope_response


@csrf_exempt
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up and answering; says nothing about its dependencies."""
    return JsonResponse({"status": "ok"})


@csrf_exempt
@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    """Ready to serve: the database and the broker both answer."""
    database, broker = probe_database(), probe_broker()
    if database.ok and broker.ok:
        return JsonResponse({"status": "ready", "database": database.detail, "broker": broker.detail})
    failing = "; ".join(p.detail for p in (database, broker) if not p.ok)
    return envelope_response(codes.NOT_READY, f"Not ready: {failing}.", 503, {"Retry-After": "5"})
