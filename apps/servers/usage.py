"""What uses a model server: the cluster member it is attached to, and the capabilities routed to it.

Answered before an operator deletes, re-places or stops a server, so they see what they are about to take
away. Clusters sit above servers (they name servers), so their models are imported inside the function.
"""

from __future__ import annotations

from typing import TypedDict

from django.db.models import Q

from apps.servers.models import ModelServer


class ClusterUse(TypedDict):
    id: int
    name: str
    member: str


class CapabilityUse(TypedDict):
    id: int
    name: str
    tier: int
    via: str  # "server" (bound as a standalone server) or "cluster" (through its cluster member)
    cluster: str | None


class UsedBy(TypedDict):
    clusters: list[ClusterUse]
    capabilities: list[CapabilityUse]


def used_by(server: ModelServer) -> UsedBy:
    """The clusters (with the member name) and capabilities (with the tier and the route) using ``server``.

    A capability reaches the server either through a routing tier that binds the server directly, or
    through a tier that binds the cluster whose member the server is attached to."""
    from apps.clusters.models import ClusterMember, RoutingTier

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
