"""What uses a model server: the cluster member it is attached to, and the capabilities routed to it.

Answered before an operator deletes, re-places or stops a server, so they see what they are about to take
away. Clusters sit above servers (they name servers), so servers cannot ask them: an app above registers
a source here at its ``AppConfig.ready()`` (``register_usage``), and ``used_by`` joins what each says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

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


UsageSource = Callable[[ModelServer], UsedBy]
_sources: list[UsageSource] = []


def register_usage(source: UsageSource) -> None:
    """Add ``source``: given a server, the clusters and capabilities using it. Registering the same
    function twice is a no-op (``ready()`` may run more than once)."""
    if source not in _sources:
        _sources.append(source)


def used_by(server: ModelServer) -> UsedBy:
    """The clusters (with the member name) and capabilities (with the tier and the route) using
    ``server``, as every registered source reports them, in registration order."""
    usage: UsedBy = {"clusters": [], "capabilities": []}
    for source in _sources:
        found = source(server)
        usage["clusters"].extend(found["clusters"])
        usage["capabilities"].extend(found["capabilities"])
    return usage
