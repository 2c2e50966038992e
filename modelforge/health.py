"""Unauthenticated probes for process supervisors and load balancers."""

from __future__ import annotations

import threading
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from modelforge.errors import codes, envelope_response
from modelforge.probes import Probe, probe_broker, probe_database_connection

# /readyz is probed often (every load balancer, every few seconds): one answer serves a process for this
# long, and concurrent probes wait for the one in flight instead of each opening a connection.
READINESS_CACHE_S = 1.0
_readiness_lock = threading.Lock()
_readiness: tuple[float, Probe, Probe] | None = None


def readiness(now: float | None = None) -> tuple[Probe, Probe]:
    """The database (a new connection within 2 s) and the broker, at most once a second per process."""
    global _readiness
    with _readiness_lock:
        now = time.monotonic() if now is None else now
        if _readiness is not None and 0 <= now - _readiness[0] < READINESS_CACHE_S:
            return _readiness[1], _readiness[2]
        database, broker = probe_database_connection(), probe_broker()
        _readiness = (now, database, broker)
        return database, broker


def forget_readiness() -> None:
    global _readiness
    with _readiness_lock:
        _readiness = None


@csrf_exempt
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up and answering; says nothing about its dependencies."""
    return JsonResponse({"status": "ok"})


@csrf_exempt
@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    """Ready to serve: a new database connection can be made now, and the broker answers.

    A pooled connection is not proof: during a stall pooled sessions answered while no new connection
    could be made (issue 13). The code names the store at fault, the database's first."""
    database, broker = readiness()
    if database.ok and broker.ok:
        return JsonResponse({"status": "ready", "database": database.detail, "broker": broker.detail})
    code = codes.DATABASE_UNREACHABLE if not database.ok else codes.BROKER_UNREACHABLE
    failing = "; ".join(p.detail for p in (database, broker) if not p.ok)
    return envelope_response(code, f"Not ready: {failing}.", 503, {"Retry-After": "5"})
