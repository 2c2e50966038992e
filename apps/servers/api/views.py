from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.servers import services
from apps.servers.api import serializers as s
from apps.servers.filtersets import ModelServerFilterSet
from apps.servers.models import ModelServer


class ModelServerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Model servers. Create = place + start (or a named refusal with every node's reason); stop; a failed
    server is restarted on its node, re-placed wherever there is room, or deleted; change its restart
    policy."""

    filterset_class = ModelServerFilterSet

    def get_queryset(self) -> QuerySet[ModelServer]:
        return ModelServer.objects.select_related("node").prefetch_related("reservations__gpu")

    def get_serializer_class(self) -> type:
        return s.ModelServerDetailSerializer if self.action == "retrieve" else s.ModelServerSerializer

    @extend_schema(request=s.PlaceRequestSerializer, responses={201: s.ModelServerDetailSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.PlaceRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        server = data.place()
        return Response(s.ModelServerDetailSerializer(server).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ServerChangeSerializer, responses={200: s.ModelServerDetailSerializer})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Change the restart policy (the only field a client may change)."""
        data = s.ServerChangeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        server = self.get_object()
        services.set_restart_policy(server, data.validated_data["restart_policy"])
        return Response(s.ModelServerDetailSerializer(server).data)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete a failed or stopped server; a failed one leaves a tombstone, so a copy still running on
        a node that was away is stopped when that node reports it."""
        services.delete(self.get_object(), by=services.operator_name(request.user))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={202: s.ModelServerDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: Any = None) -> Response:
        server = self.get_object()
        services.stop(server, by=services.operator_name(request.user))
        return Response(s.ModelServerDetailSerializer(server).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: s.ModelServerDetailSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: Any = None) -> Response:
        """Start a failed server again on its own node (its headroom is checked there again)."""
        server = services.restart(self.get_object(), by=services.operator_name(request.user))
        return Response(s.ModelServerDetailSerializer(server).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: s.ModelServerDetailSerializer})
    @action(detail=True, methods=["post"])
    def replace(self, request: Request, pk: Any = None) -> Response:
        """Place a failed server again wherever the scheduler finds room; it keeps its identity, so its
        clusters and capabilities still name it."""
        server = services.replace(self.get_object(), by=services.operator_name(request.user))
        return Response(s.ModelServerDetailSerializer(server).data, status=status.HTTP_202_ACCEPTED)
