"""What an operator may do to a cluster's membership, written once: the API, the dashboard and the admin
call these functions, so each surface refuses the same way with the same code.

The membership lock: a member's name, GPUs and weight are the deploy shape, so while any member of the
cluster has a server attached, adding, changing or removing a member is refused
(``CLUSTER_MEMBERSHIP_LOCKED``, 409): detach the servers first. The algorithm is a runtime router knob and
is not locked. Every membership write and every attach holds the cluster's row lock while it checks and
writes, so an attach cannot slip in between a membership check and its write.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction

from apps.clusters import codes
from apps.clusters.models import Cluster, ClusterMember
from apps.servers.models import ModelServer
from modelforge.errors import ApiError
from modelforge.errors import codes as error_codes

# What a membership edit may change (the server is attached and detached, never edited).
MEMBER_FIELDS = ("cluster", "name", "gpus", "weight")


def membership_locked(cluster: Cluster) -> bool:
    """Whether membership changes are refused now: a member of ``cluster`` has a server attached."""
    return cluster.has_servers_attached()


def refuse_membership_change(cluster: Cluster) -> None:
    """Membership (GPUs, weights, names) changes the deploy shape: detach the servers first."""
    if membership_locked(cluster):
        raise ApiError(
            codes.CLUSTER_MEMBERSHIP_LOCKED,
            f"Cluster {cluster.name} has servers attached; membership changes (GPUs, weights, member names) "
            "change the deploy shape. Detach the servers first. The algorithm can be changed while "
            "attached.",
            409,
        )


def _lock(clusters: Iterable[Cluster]) -> None:
    """Take the row locks of ``clusters`` (in id order, so two writers never wait on each other) and
    refuse if any of them has servers attached. Inside a transaction."""
    pks = sorted({cluster.pk for cluster in clusters})
    for cluster in Cluster.objects.select_for_update().filter(pk__in=pks).order_by("pk"):
        refuse_membership_change(cluster)


def add_member(cluster: Cluster, *, name: str, gpus: int = 1, weight: int = 1) -> ClusterMember:
    """A new member of ``cluster``; refused while the cluster has servers attached."""
    with transaction.atomic():
        _lock([cluster])
        return ClusterMember.objects.create(cluster=cluster, name=name, gpus=gpus, weight=weight)


def edit_member(member: ClusterMember, **changes: Any) -> ClusterMember:
    """Rename, re-size, re-weight or move ``member``; refused while its cluster (or, for a move, the
    cluster it moves to) has servers attached."""
    unknown = set(changes) - set(MEMBER_FIELDS)
    if unknown:
        raise ValueError(f"not membership fields: {', '.join(sorted(unknown))}")
    with transaction.atomic():
        _lock([member.cluster, changes.get("cluster", member.cluster)])
        for field, value in changes.items():
            setattr(member, field, value)
        if changes:
            member.save(update_fields=list(changes))
    return member


def remove_member(member: ClusterMember) -> None:
    """Remove ``member``; refused while its cluster has servers attached."""
    with transaction.atomic():
        _lock([member.cluster])
        member.delete()


def attach(member: ClusterMember, server: ModelServer) -> None:
    """Attach ``server`` to ``member``; a server serves one member at most (``VALIDATION_ERROR``, 400).
    Holds the cluster's lock (a concurrent membership change waits) and the server's (a concurrent
    attach of the same server elsewhere waits, then is refused by name, not by the unique index)."""
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=member.cluster_id).first()
        ModelServer.objects.select_for_update().filter(pk=server.pk).first()
        if ClusterMember.objects.filter(server=server).exclude(pk=member.pk).exists():
            raise ApiError(
                error_codes.VALIDATION_ERROR, f"server: {server.name} is already attached to a member.", 400
            )
        member.server = server
        member.save(update_fields=["server"])


def detach(member: ClusterMember) -> None:
    """Detach whatever server ``member`` has (nothing to do if none): always allowed."""
    member.server = None
    member.save(update_fields=["server"])


def create_cluster(
    *, name: str, algorithm: str | None = None, servers: Iterable[ModelServer] = ()
) -> Cluster:
    """A new cluster, with a member per server (named after it, its GPUs, weight 1), each attached, in
    one transaction. Which servers may be picked is the serializer's validation (state, already serving)."""
    with transaction.atomic():
        fields = {"name": name} if algorithm is None else {"name": name, "algorithm": algorithm}
        cluster = Cluster.objects.create(**fields)
        for server in servers:
            member = ClusterMember.objects.create(
                cluster=cluster, name=server.name[:63], gpus=server.gpus_wanted, weight=1
            )
            attach(member, server)
    return cluster


def delete_cluster(cluster: Cluster) -> None:
    """Delete ``cluster`` with its members and routing tiers; refused while a server is attached (routing
    would be pulled from under live traffic): detach the servers first."""
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if membership_locked(locked):
            raise ApiError(
                codes.CLUSTER_MEMBERSHIP_LOCKED,
                f"Cluster {cluster.name} has servers attached; deleting it would take its routing from under "
                "live traffic. Detach the servers first.",
                409,
            )
        locked.delete()
