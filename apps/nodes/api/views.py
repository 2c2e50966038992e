from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.nodes import listening
from apps.nodes.api import serializers as s
from apps.nodes.enrollment import enroll
from apps.nodes.filtersets import EnrollmentTokenFilterSet, NodeFilterSet
from apps.nodes.models import EnrollmentToken, Node
from apps.nodes.tasks import ping_node
from modelforge import auththrottle, dispatch
from modelforge.errors import ApiError


def _operator(request: Request) -> str:
    return str(getattr(request.user, "username", None) or request.user)


class EnrollView(APIView):
    """An agent trades a single-use enrollment token for its node identity and credential."""

    authentication_classes: list[type] = []
    permission_classes: list[type] = []

    @extend_schema(
        request=s.EnrollRequestSerializer,
        responses={201: s.EnrollResponseSerializer},
        operation_id="agent_enroll",
    )
    def post(self, request: Request) -> Response:
        # An address with too many failed tokens is refused before its token is looked at: a valid token
        # from it waits, unspent, until the block ends (modelforge.auththrottle).
        source = auththrottle.source_of(request)
        auththrottle.refuse_if_blocked(auththrottle.ENROLLMENT, source)
        data = s.EnrollRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            enrollment = enroll(**data.validated_data)
        except ApiError as exc:
            if exc.status == 401:  # unknown, revoked or expired: a failed authentication
                auththrottle.count_failure(auththrottle.ENROLLMENT, source)
            raise
        body = {
            "node_id": enrollment.node.pk,
            "node_name": enrollment.node.name,
            "credential": enrollment.credential,
            "heartbeat_interval_s": settings.HEARTBEAT_INTERVAL,
        }
        return Response(s.EnrollResponseSerializer(body).data, status=status.HTTP_201_CREATED)


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Enrolled nodes; filter by liveness, enabled, accelerator, name."""

    filterset_class = NodeFilterSet

    def get_queryset(self) -> QuerySet[Node]:
        return Node.objects.with_liveness().prefetch_related("gpus")

    def get_serializer_class(self) -> type:
        return s.NodeDetailSerializer if self.action == "retrieve" else s.NodeSerializer

    @extend_schema(request=None, responses=s.NodeDetailSerializer)
    @action(detail=True, methods=["post"])
    def enable(self, request: Request, pk: Any = None) -> Response:
        node = self.get_object()
        node.set_enabled(True, by=_operator(request))
        return Response(s.NodeDetailSerializer(node).data)

    @extend_schema(request=None, responses=s.NodeDetailSerializer)
    @action(detail=True, methods=["post"])
    def disable(self, request: Request, pk: Any = None) -> Response:
        node = self.get_object()
        node.set_enabled(False, by=_operator(request))
        return Response(s.NodeDetailSerializer(node).data)

    @extend_schema(request=None, responses={202: s.PingSerializer})
    @action(detail=True, methods=["post"])
    def ping(self, request: Request, pk: Any = None) -> Response:
        """Enqueue a signed ping; the result shows on the node (agent_reached_at, cluster_secret_mismatch)."""
        node = self.get_object()
        task_id = dispatch.send_or_refuse(ping_node, str(node.pk))
        return Response({"task_id": task_id}, status=status.HTTP_202_ACCEPTED)


class ListeningView(APIView):
    """Since when the control plane has been able to hear its nodes (silence is counted from there), and
    the mass-loss hold: nodes that went silent at once, held stale until an operator confirms the loss."""

    @extend_schema(responses=s.ListeningClockSerializer, operation_id="nodes_listening")
    def get(self, request: Request) -> Response:
        return Response(s.ListeningClockSerializer(listening.current()).data)


class MassLossConfirmView(APIView):
    """The operator confirms that the nodes held by ``NODE_MASS_LOSS`` are really gone: the next sweep
    may take them offline. ``409 NODE_MASS_LOSS_NOT_HELD`` when nothing is held."""

    @extend_schema(request=None, responses=s.ListeningClockSerializer, operation_id="nodes_mass_loss_confirm")
    def post(self, request: Request) -> Response:
        clock = listening.confirm_mass_loss(by=_operator(request))
        return Response(s.ListeningClockSerializer(clock).data)


class EnrollmentTokenViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Mint (the token is shown once, in the create response), list and revoke enrollment tokens."""

    queryset = EnrollmentToken.objects.select_related("node")
    serializer_class = s.EnrollmentTokenSerializer
    filterset_class = EnrollmentTokenFilterSet

    @extend_schema(request=s.EnrollmentTokenSerializer, responses={201: s.MintedTokenSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.EnrollmentTokenSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = request.user if getattr(request.user, "pk", None) else None
        token, plain = EnrollmentToken.objects.mint(
            note=data.validated_data.get("note", ""),
            ttl_seconds=data.validated_data.get("ttl_seconds"),
            created_by=user,
        )
        body = s.MintedTokenSerializer(token).data
        body["token"] = plain
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.EnrollmentTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: Any = None) -> Response:
        token = self.get_object()
        token.revoke()
        token.refresh_from_db()
        return Response(s.EnrollmentTokenSerializer(token).data)
