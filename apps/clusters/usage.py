"""The clusters and capabilities using a model server, for apps.servers.usage (registered at ready())."""

from __future__ import annotations

from django.db.models import Q

from apps.clusters.models import ClusterMember, RoutingTier
from apps.servers.models import ModelServer
from apps.servers.usage import CapabilityUse, ClusterUse, UsedBy


def server_usage(server: ModelServer) -> UsedBy:
    """The cluster (with the member name) and capabilities (with the tier and the route) using ``server``.

    A capability reaches the server either through a routing tier that binds the server directly, or
    through a tier that binds the cluster whose member the server is attached to."""
    member = ClusterMember.objects.select_related("cluster").filter(server=server).first()
    clusters: list[ClusterUse] = []
    routes = Q(server=server)
    if member is not None:
        clusters.append({"id": member.cluster.pk, "name": member.cluster.name, "member": member.name})
        routes |= Q(cluster=member.cluster)
    tiers = RoutingTier.objects.filter(routes).select_related("capability", "cluster")
    capabilities: list[CapabilityUse] = [
        {
            "id": tier.capability.pk,
            "name": tier.capability.name,
            "tier": tier.tier,
            "via": "cluster" if tier.cluster_id else "server",
            "cluster": tier.cluster.name if tier.cluster is not None else None,
        }
        for tier in tiers
    ]
    return {"clusters": clusters, "capabilities": capabilities}
