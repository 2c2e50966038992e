from __future__ import annotations

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from apps.core import work, work_actions
from apps.core.api.serializers import (
    InvariantsSerializer,
    SystemStatusSerializer,
    WorkerProbeSerializer,
    WorkFailedSerializer,
    WorkFilterSerializer,
    WorkSerializer,
)
from apps.core.status import system_status
from apps.core.tasks import record_worker_seen
from modelforge import dispatch
from modelforge.openapi import EMPTY_REFUSED


class SystemStatusView(APIView):
    """The platform's own health: release, database, broker, when a worker last ran a task."""

    @extend_schema(responses=SystemStatusSerializer, operation_id="system_status")
    def get(self, request: Request) -> Response:
        return Response(SystemStatusSerializer(system_status().as_dict()).data)


class WorkerProbeView(APIView):
    """Enqueue a task that stamps the installation; ``worker_seen_at`` moves when a worker ran it."""

    @extend_schema(request=None, responses={202: WorkerProbeSerializer}, operation_id="system_worker_probe")
    def post(self, request: Request) -> Response:
        # The probe reads no row this request writes: sent now, and refused by name when the broker does not
        # take it (no row is left for the watchdog to re-send).
        task_id = dispatch.send_or_refuse(record_worker_seen)
        status_url = reverse("api:system-status", request=request)
        return Response(
            WorkerProbeSerializer({"task_id": task_id, "status_url": status_url}).data,
            status=202,
        )


class InvariantsView(APIView):
    """The platform invariants on the live database: ``sound``, and each one's count of rows that break
    it. Authoritative tables only (never the monitoring store). 200 either way: a broken invariant is an
    answer, not an error."""

    @extend_schema(responses=InvariantsSerializer, operation_id="system_invariants")
    def get(self, request: Request) -> Response:
        from apps.core.invariants import check_live

        return Response(check_live())


def _operator(request: Request) -> str:
    return str(getattr(request.user, "username", None) or request.user)


WORK_PATH = [
    OpenApiParameter("kind", OpenApiTypes.STR, OpenApiParameter.PATH, enum=list(work.KINDS)),
    OpenApiParameter("id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The row's id."),
]


class WorkListView(generics.GenericAPIView):
    """Every row waiting on background work, oldest first: what it waits on, since when, its bound and
    whether it is past it (``stuck``: it has raised ``WORK_STUCK``). The way out is retry or fail."""

    serializer_class = WorkSerializer
    filter_backends: list[type] = []  # the filters are the two below, read by WorkFilterSerializer

    @extend_schema(
        operation_id="system_work_list",
        parameters=[
            # Empty is not "any" here (WorkFilterSerializer): the schema says so (modelforge.openapi).
            OpenApiParameter(
                "kind",
                OpenApiTypes.STR,
                enum=list(work.KINDS),
                description="Only this kind.",
                extensions={EMPTY_REFUSED: True},
            ),
            OpenApiParameter(
                "stuck",
                OpenApiTypes.BOOL,
                description="Only rows past (true) or within (false) their bound.",
                extensions={EMPTY_REFUSED: True},
            ),
        ],
        responses=WorkSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        filters = WorkFilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        now = timezone.now()
        rows = [item.as_dict(now) for item in filters.rows(now)]
        # The project's paginator (its limits and shape) over a list: the rows come from several tables.
        page = self.paginate_queryset(rows)  # type: ignore[arg-type, var-annotated]
        return self.get_paginated_response(WorkSerializer(page, many=True).data)


class WorkRetryView(APIView):
    """Send a waiting row's work again (every task claims its row first, so a retry never runs it twice).
    202 with the row: the work is sent, not done; a broker that is away delays it, the watchdog re-sends."""

    @extend_schema(
        operation_id="system_work_retry", parameters=WORK_PATH, request=None, responses={202: WorkSerializer}
    )
    def post(self, request: Request, kind: str, id: str) -> Response:
        item = work.retry(kind, id, by=_operator(request))
        return Response(WorkSerializer(item.as_dict(timezone.now())).data, status=202)


class WorkFailView(APIView):
    """Mark a waiting row failed (``WORK_CANCELLED`` and ``marked failed by <operator>``) and clear its
    ``WORK_STUCK``; a row that moved on meanwhile is ``409 WORK_NOT_WAITING`` and nothing is changed."""

    @extend_schema(
        operation_id="system_work_fail",
        parameters=WORK_PATH,
        request=None,
        responses={200: WorkFailedSerializer},
    )
    def post(self, request: Request, kind: str, id: str) -> Response:
        by = _operator(request)
        item = work_actions.mark_failed(kind, id, by)
        answer = {"kind": item.kind, "id": item.id, "name": item.name, "was": item.state, "state": "failed"}
        return Response(WorkFailedSerializer({**answer, "by": by}).data)
