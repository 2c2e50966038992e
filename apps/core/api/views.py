from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from apps.core.api.serializers import SystemStatusSerializer, WorkerProbeSerializer
from apps.core.status import system_status
from apps.core.tasks import record_worker_seen


class SystemStatusView(APIView):
    """The platform's own health: release, database, broker, when a worker last ran a task."""

    @extend_schema(responses=SystemStatusSerializer, operation_id="system_status")
    def get(self, request: Request) -> Response:
        return Response(SystemStatusSerializer(system_status().as_dict()).data)


class WorkerProbeView(APIView):
    """Enqueue a task that stamps the installation; ``worker_seen_at`` moves when a worker ran it."""

    @extend_schema(request=None, responses={202: WorkerProbeSerializer}, operation_id="system_worker_probe")
    def post(self, request: Request) -> Response:
        task_id: list[str] = []
        # Enqueued on commit: a task never runs against a transaction that might still roll back.
        transaction.on_commit(lambda: task_id.append(record_worker_seen.delay().id))
        status_url = reverse("api:system-status", request=request)
        return Response(
            WorkerProbeSerializer({"task_id": task_id[0] if task_id else "", "status_url": status_url}).data,
            status=202,
        )


class InvariantsView(APIView):
    """The platform invariants on the live database: ``sound``, and each one's count of rows that break
    it. Authoritative tables only (never the monitoring store). 200 either way: a broken invariant is an
    answer, not an error."""

    @extend_schema(responses={200: None}, operation_id="system_invariants")
    def get(self, request: Request) -> Response:
        from apps.core.invariants import check_live

        return Response(check_live())
