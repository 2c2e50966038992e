from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.alerts.models import Alert
from apps.backups import codes, restore, services, snapshot
from apps.backups.api.serializers import (
    BackupSerializer,
    BackupSummarySerializer,
    RestoreRequestSerializer,
    RestoreSerializer,
    ReviewSerializer,
)
from apps.backups.filtersets import BackupFilterSet, RestoreFilterSet
from apps.backups.models import Backup, Restore, ReviewDecision
from apps.backups.tasks import run_restore, take_backup
from modelforge.dispatch import send_on_commit


def _who(request: Request) -> str:
    return str(getattr(request.user, "username", request.user))


class BackupViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Backups of the control-plane database: queued, running, completed, verified (restore-eligible) or
    failed with a reason code. ``POST`` takes one now; verification follows automatically."""

    queryset = Backup.objects.prefetch_related("events")
    serializer_class = BackupSerializer
    filterset_class = BackupFilterSet

    @extend_schema(request=None, responses={202: BackupSerializer})
    def create(self, request: Request) -> Response:
        backup = snapshot.request_backup(trigger="operator", by=_who(request))
        send_on_commit(take_backup, backup.pk)
        return Response(BackupSerializer(backup).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={
            202: BackupSerializer,
            200: OpenApiResponse(BackupSerializer, description="Not completed or verified: nothing is sent."),
        },
    )
    @action(detail=True, methods=["post"])
    def verify(self, request: Request, pk: Any = None) -> Response:
        """Verify again (a verified backup whose files changed becomes failed / VERIFICATION_FAILED)."""
        backup = self.get_object()
        sent = services.request_verification(backup)
        return Response(
            BackupSerializer(backup).data, status=status.HTTP_202_ACCEPTED if sent else status.HTTP_200_OK
        )

    @extend_schema(responses=BackupSummarySerializer)
    @action(detail=False, methods=["get"])
    def summary(self, request: Request) -> Response:
        """The current RPO exposure (now minus the newest verified backup's snapshot) and staleness."""
        newest = Backup.objects.newest_verified()
        stale = Alert.objects.open().filter(code=codes.BACKUP_STALE).exists()
        data = {
            "newest_verified": BackupSerializer(newest).data if newest else None,
            "rpo_exposure_seconds": snapshot.rpo_exposure(),
            "stale_after_seconds": settings.BACKUP_STALE_AFTER,
            "stale": stale,
            "backup_root": str(settings.BACKUP_ROOT),
        }
        return Response(data)


class RestoreViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Restores of verified backups, by an operator, in recorded phases. A restore that stops mid-phase is
    ``RESTORE_FAILED`` and waits for ``acknowledge`` or ``abandon``; nothing resumes it."""

    queryset = Restore.objects.select_related("backup").prefetch_related("phases")
    serializer_class = RestoreSerializer
    filterset_class = RestoreFilterSet

    @extend_schema(request=RestoreRequestSerializer, responses={202: RestoreSerializer})
    def create(self, request: Request) -> Response:
        if isinstance(request.data, dict) and request.data.get("point_in_time") is not None:
            raise restore.refuse_point_in_time()
        data = RestoreRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        queued = restore.request_restore(
            data.validated_data["backup"], by=_who(request), reason=data.validated_data["reason"]
        )
        send_on_commit(run_restore, queued.pk)
        return Response(RestoreSerializer(queued).data, status=status.HTTP_202_ACCEPTED)

    def _review(self, request: Request, decision: str) -> Response:
        data = ReviewSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        done = restore.review(
            self.get_object(), decision=decision, by=_who(request), note=data.validated_data["reason"]
        )
        return Response(RestoreSerializer(done).data)

    @extend_schema(request=ReviewSerializer, responses=RestoreSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: Any = None) -> Response:
        """Review a failed restore: its outcome stands (recorded with who and why)."""
        return self._review(request, ReviewDecision.ACKNOWLEDGE)

    @extend_schema(request=ReviewSerializer, responses=RestoreSerializer)
    @action(detail=True, methods=["post"])
    def abandon(self, request: Request, pk: Any = None) -> Response:
        """Review a failed restore: drop its left-over database (never the one in service)."""
        return self._review(request, ReviewDecision.ABANDON)
