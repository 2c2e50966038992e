from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.clusters import services
from apps.clusters.api import serializers as s
from apps.clusters.loadbalancer import cluster_report
from apps.clusters.models import (
    Capability,
    ClientCredential,
    Cluster,
    ClusterMember,
    ProjectLimits,
    RoutingTier,
    effective_limits,
    project_defaults,
)
from apps.servers.models import ModelServer
from modelforge.lookups import by_pk


class CapabilityViewSet(viewsets.ModelViewSet):
    queryset = Capability.objects.select_related("embedding_space", "follows__embedding_space")
    serializer_class = s.CapabilitySerializer


class ClusterViewSet(viewsets.ModelViewSet):
    """Clusters. The algorithm may change with servers attached: it is a runtime router knob. Deleting one
    with servers attached is refused (CLUSTER_MEMBERSHIP_LOCKED): detach them first."""

    queryset = Cluster.objects.prefetch_related("members")
    serializer_class = s.ClusterSerializer

    def get_serializer_class(self) -> type[s.ClusterSerializer]:
        return s.ClusterCreateSerializer if self.action == "create" else s.ClusterSerializer

    def perform_destroy(self, instance: Cluster) -> None:
        services.delete_cluster(instance)  # refused while servers are attached (CLUSTER_MEMBERSHIP_LOCKED)

    @extend_schema(responses=s.LoadBalancerReportSerializer)
    @action(detail=True, methods=["get"], url_path="load-balancer")
    def load_balancer(self, request: Request, pk: Any = None) -> Response:
        """Configured against actual share per member over the last minutes, drift, bench state."""
        return Response(cluster_report(self.get_object()))


class ClusterMemberViewSet(viewsets.ModelViewSet):
    """Members. Creating, renaming, re-weighting, re-sizing or removing one is refused while the cluster
    has servers attached (CLUSTER_MEMBERSHIP_LOCKED): detach them first."""

    queryset = ClusterMember.objects.select_related("cluster", "server")
    serializer_class = s.ClusterMemberSerializer

    def perform_create(self, serializer: Any) -> None:
        fields = dict(serializer.validated_data)
        serializer.instance = services.add_member(fields.pop("cluster"), **fields)

    def perform_update(self, serializer: Any) -> None:
        services.edit_member(serializer.instance, **serializer.validated_data)

    def perform_destroy(self, instance: ClusterMember) -> None:
        services.remove_member(instance)

    @extend_schema(request=s.AttachSerializer, responses=s.ClusterMemberSerializer)
    @action(detail=True, methods=["post"])
    def attach(self, request: Request, pk: Any = None) -> Response:
        member = self.get_object()
        server_id = request.data.get("server") if isinstance(request.data, dict) else None
        server = by_pk(ModelServer.objects.all(), server_id)
        if server is None:
            raise serializers.ValidationError({"server": ["Give the id of an existing model server."]})
        services.attach(member, server)
        return Response(s.ClusterMemberSerializer(member).data)

    @extend_schema(request=None, responses=s.ClusterMemberSerializer)
    @action(detail=True, methods=["post"])
    def detach(self, request: Request, pk: Any = None) -> Response:
        member = self.get_object()
        services.detach(member)
        return Response(s.ClusterMemberSerializer(member).data)


class RoutingTierViewSet(viewsets.ModelViewSet):
    queryset = RoutingTier.objects.all()
    serializer_class = s.RoutingTierSerializer


class ClientCredentialViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Client credentials: minted (shown once), listed, revoked."""

    queryset = ClientCredential.objects.all()
    serializer_class = s.ClientCredentialSerializer

    @extend_schema(request=s.ClientCredentialSerializer, responses={201: s.MintedCredentialSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.ClientCredentialSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        credential, plain = data.mint(created_by=request.user)
        body = s.MintedCredentialSerializer(credential).data
        body["credential"] = plain
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.LimitsSerializer, responses=s.ClientCredentialSerializer)
    @action(detail=True, methods=["post"])
    def limits(self, request: Request, pk: Any = None) -> Response:
        """Set every limit at once (null: none); every gateway process applies them within about a
        second (the routing table's change notice)."""
        credential = self.get_object()
        data = s.LimitsSerializer(credential, data=request.data)
        data.is_valid(raise_exception=True)
        data.save()
        return Response(s.ClientCredentialSerializer(credential).data)

    @extend_schema(request=None, responses=s.CredentialUseSerializer)
    @action(detail=True, methods=["get"])
    def use(self, request: Request, pk: Any = None) -> Response:
        """What the credential uses now, as its limits count it (Redis), and the limits that apply (its
        own, else its project's defaults)."""
        from apps.clusters.limits import current_use

        credential = self.get_object()
        applied = effective_limits(credential, project_defaults(credential.project))
        return Response(
            {
                **current_use(str(credential.pk)),
                "limits": {field: value for field, (value, _) in applied.items()},
                "limits_from": {field: source for field, (_, source) in applied.items()},
            }
        )

    @extend_schema(request=None, responses=s.ClientCredentialSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: Any = None) -> Response:
        credential = self.get_object()
        credential.revoke()
        credential.refresh_from_db()
        return Response(s.ClientCredentialSerializer(credential).data)


class ProjectLimitsViewSet(viewsets.ModelViewSet):
    """Default limits per project: a credential of the project that leaves a limit empty has the
    project's. Every gateway process applies a change within about a second (the routing table's change
    notice). ``?project=`` finds one project's."""

    queryset = ProjectLimits.objects.all()
    serializer_class = s.ProjectLimitsSerializer

    def get_queryset(self) -> Any:
        queryset = super().get_queryset()
        project = self.request.query_params.get("project")
        return queryset if project is None else queryset.filter(project=project)
