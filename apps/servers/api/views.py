from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.servers.api import serializers as s
from apps.servers.filtersets import ModelServerFilterSet
from apps.servers.models import ModelServer
from apps.servers.scheduler import Request as PlaceRequest
from apps.servers.scheduler import place


class ModelServerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Model servers. Create = place + start (or a named refusal with every node's reason); stop."""

    filterset_class = ModelServerFilterSet

    def get_queryset(self) -> QuerySet[ModelServer]:
        return ModelServer.objects.select_related("node").prefetch_related("reservations__gpu")

    def get_serializer_class(self) -> type:
        return s.ModelServerDetailSerializer if self.action == "retrieve" else s.ModelServerSerializer

    @extend_schema(request=s.PlaceRequestSerializer, responses={201: s.ModelServerDetailSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.PlaceRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        server = place(PlaceRequest(**data.validated_data))
        return Response(s.ModelServerDetailSerializer(server).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: s.ModelServerDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: Any = None) -> Response:
        server = self.get_object()
        server.request_stop(by=str(getattr(request.user, "username", request.user)))
        return Response(s.ModelServerDetailSerializer(server).data, status=status.HTTP_202_ACCEPTED)
