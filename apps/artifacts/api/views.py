from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.artifacts import acquisition, replication, services
from apps.artifacts.api.serializers import (
    AmendSerializer,
    ArtifactSerializer,
    ReleaseSerializer,
    ReplicaSerializer,
)
from apps.artifacts.filtersets import ArtifactFilterSet, ReplicaFilterSet
from apps.artifacts.models import Artifact, Replica
from apps.artifacts.tasks import acquire
from modelforge.dispatch import send_on_commit


class ArtifactViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Artifacts: requested with their upstream identity, acquired by a worker (progress in
    ``progress_bytes``), checked; a failed check quarantines with the rule; release is an operator's
    recorded decision and a fresh pass of the checks."""

    queryset = Artifact.objects.prefetch_related("events")
    serializer_class = ArtifactSerializer
    filterset_class = ArtifactFilterSet

    def perform_create(self, serializer: Any) -> None:
        artifact = serializer.save()
        send_on_commit(acquire, artifact.pk)

    @extend_schema(request=ReleaseSerializer, responses=ArtifactSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: Any = None) -> Response:
        data = ReleaseSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        artifact = acquisition.release(
            self.get_object(),
            by=str(getattr(request.user, "username", request.user)),
            reason=data.validated_data["reason"],
        )
        return Response(ArtifactSerializer(artifact).data)

    @extend_schema(request=AmendSerializer, responses=ArtifactSerializer)
    @action(detail=True, methods=["post"])
    def amend(self, request: Request, pk: Any = None) -> Response:
        """Correct a quarantined artifact's licence or expected digests (who, why, before and after are
        recorded); it stays quarantined until ``release`` passes every check again."""
        data = AmendSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        changes = {k: v for k, v in data.validated_data.items() if k != "reason"}
        artifact = acquisition.amend(
            self.get_object(),
            by=str(getattr(request.user, "username", request.user)),
            reason=data.validated_data["reason"],
            changes=changes,
        )
        return Response(ArtifactSerializer(artifact).data)

    @extend_schema(request=None, responses={202: ArtifactSerializer})
    @action(detail=True, methods=["post"])
    def rehydrate(self, request: Request, pk: Any = None) -> Response:
        """Re-acquire a lost or corrupt store copy from the recorded upstream only (never elsewhere).
        Refused up front, nothing sent: 409 ``ARTIFACT_HAS_NO_FILES`` (nothing recorded to verify against)
        or 409 ``ARTIFACT_QUARANTINED`` (release it first)."""
        artifact = services.request_rehydration(
            self.get_object(), by=str(getattr(request.user, "username", request.user))
        )
        return Response(ArtifactSerializer(artifact).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: ArtifactSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: Any = None) -> Response:
        """Acquire a failed artifact again from its recorded upstream. Refused up front, nothing sent:
        409 ``ARTIFACT_NOT_FAILED`` (only a failed acquisition is retried) or 409
        ``ARTIFACT_REHYDRATION_BLOCKED`` (register a new artifact instead)."""
        artifact = services.retry_acquisition(
            self.get_object(), by=str(getattr(request.user, "username", request.user))
        )
        return Response(ArtifactSerializer(artifact).data, status=status.HTTP_202_ACCEPTED)


class ReplicaViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Replicas: ask for an artifact on a node (explicit, never automatic), watch its progress, re-try."""

    queryset = Replica.objects.select_related("artifact", "node")
    serializer_class = ReplicaSerializer
    filterset_class = ReplicaFilterSet

    @extend_schema(responses={202: ReplicaSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Ask for the artifact on the node, or again (a failed replica is retried, a present or copying
        one is answered as it is): the copy is sent to a worker, not done."""
        data = ReplicaSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        replica = replication.request_replica(
            data.validated_data["artifact"],
            data.validated_data["node"],
            by=str(getattr(request.user, "username", request.user)),
        )
        return Response(ReplicaSerializer(replica).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: ReplicaSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: Any = None) -> Response:
        replica = self.get_object()
        replica = replication.request_replica(
            replica.artifact, replica.node, by=str(getattr(request.user, "username", request.user))
        )
        return Response(ReplicaSerializer(replica).data, status=status.HTTP_202_ACCEPTED)
