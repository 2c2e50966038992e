"""What the configuration binds each capability to right now, and the routing version that says it changed.

The gateway (apps/gateway/routing.py) builds its cached table from ``read_bindings`` and follows
``VERSION_KEY``, woken by a notice on ``CHANGED_CHANNEL`` when it moves; the capability health check
and the embedding-space probe read the same bindings, so all three agree on which backends serve a
capability. Clusters sits below the gateway and never imports it: this module is the configuration's
side of that contract.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection, models, transaction
from redis.backoff import NoBackoff
from redis.retry import Retry

from apps.clusters.models import Algorithm, Capability, ClusterMember, RoutingTier
from apps.nodes.choices import Liveness
from apps.nodes.models import Node, liveness_now
from apps.servers import codes as server_codes
from apps.servers.choices import ServerState
from apps.servers.models import ModelServer
from apps.servers.profiles import ENDPOINT_PATHS, runtime_profiles

logger = logging.getLogger("modelforge.gateway")

VERSION_KEY = "modelforge:routing:version"
# Redis pub/sub: the new version, published with every bump, so each web process's refresher rebuilds its
# table at once rather than at its next version check.
CHANGED_CHANNEL = "modelforge:routing:changed"
# How stale a process's table may get when the version cannot be read (apps/gateway/routing.py).
REBUILD_AT_LEAST_EVERY_S = 5.0


@lru_cache(maxsize=1)
def routing_redis() -> redis.Redis:
    # One retry (a pooled connection that died with a Redis restart), not redis-py's default of ten with
    # backoff: with Redis away, a version check or a bump would otherwise take about 4 s to fail.
    return redis.Redis.from_url(
        settings.CELERY_BROKER_URL,
        socket_connect_timeout=0.5,
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 1),
    )


def bump_version() -> None:
    """Tell every process its routing table is out of date, once the change is committed.

    After the commit, not at the save: a notice acted on at once (the gateway's refresher rebuilds within a
    millisecond) would otherwise read the rows as they were before the transaction and keep them. Several
    changes in one transaction send one notice."""
    if connection.in_atomic_block:
        if any(entry[1] is _bump_now for entry in connection.run_on_commit):
            return
        transaction.on_commit(_bump_now)
    else:
        _bump_now()


def _bump_now() -> None:
    try:
        with routing_redis().pipeline(transaction=False) as pipe:
            pipe.incr(VERSION_KEY)
            pipe.publish(CHANGED_CHANNEL, b"")
            pipe.execute()
    except redis.RedisError as exc:
        logger.warning(
            "routing version not bumped, Redis unreachable (%s): tables refresh within %.0f s",
            type(exc).__name__,
            REBUILD_AT_LEAST_EVERY_S,
        )


@dataclass(frozen=True)
class Backend:
    """A running model server the gateway may send requests to."""

    key: str
    name: str
    url: str
    weight: int
    # The OpenAI paths its runtime profile says the engine serves (every one when the profile is gone:
    # a running server is not cut off because a manifest file was removed).
    endpoints: frozenset[str] = frozenset(ENDPOINT_PATHS.values())
    # Requests the gateway sends it at once (its runtime profile's ``max_concurrent``); None: no limit.
    max_concurrent: int | None = None
    # What the gateway probes (its runtime profile's launch.health_path; /health when the profile is gone).
    health_path: str = "/health"
    # The node it runs on: only that node's agent is believed about its engine (apps/gateway/engines.py).
    node: str = ""


@dataclass(frozen=True)
class Binding:
    """A tier's binding: a cluster (with its algorithm) or a standalone server."""

    tier: int
    project: str
    cluster: str | None
    algorithm: str
    backends: tuple[Backend, ...]
    # Members with a server attached (running or not); a standalone server's binding: 1. Read only by the
    # gateway's refusal, to say "detached" rather than "no node runs one".
    attached: int = 1


def management_lost() -> tuple[set[Any], set[Any]]:
    """The enabled nodes whose agent is silent (stale or offline: management lost), and all enabled nodes.

    Serving follows the data plane (2026-12-07, docs/DECISIONS.md): a server runs where its agent last said
    it runs, and the gateway's probes and sin-bin decide whether it answers; a silent agent says nothing
    about the engine beside it. So node liveness no longer gates routing. A server the offline sweep failed
    ``NODE_OFFLINE`` (the books' "whether the process still runs is unknown") is routed while its node is
    still silent; once the node reports again, reconcile adopts it (running) or it stays out: its
    reservation was released, and its port may be another server's by then. Placement still wants fresh
    telemetry (``Node.objects.assignable``).
    """
    lost: set[Any] = set()
    routed: set[Any] = set()
    for pk, now in Node.objects.filter(enabled=True).annotate(now=liveness_now()).values_list("pk", "now"):
        routed.add(pk)
        if now in (Liveness.STALE, Liveness.OFFLINE):
            lost.add(pk)
    return lost, routed


def read_bindings() -> tuple[dict[str, list[Binding]], dict[str, str]]:
    """Every capability's tier bindings with the running backends of each, in a handful of queries; and
    which capability follows which (a consumer alias's query name), a follower bound as the one it follows."""
    lost, routed = management_lost()
    running = {
        s.pk: s
        for s in ModelServer.objects.filter(
            models.Q(state=ServerState.RUNNING)
            | models.Q(state=ServerState.FAILED, failure_code=server_codes.NODE_OFFLINE),
            port__isnull=False,
        ).select_related("node")
        if s.node_id in routed and (s.state == ServerState.RUNNING or s.node_id in lost)
    }

    profiles = runtime_profiles()

    def backend(server: ModelServer, name: str, weight: int) -> Backend | None:
        if server.pk not in running or weight <= 0:
            return None
        host = (
            server.node.agent_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]  # type: ignore[union-attr]
            or "127.0.0.1"
        )
        profile = profiles.get(server.profile)
        endpoints = profile.endpoints if profile is not None else frozenset(ENDPOINT_PATHS.values())
        return Backend(
            str(server.pk),
            name,
            f"http://{host}:{server.port}",
            weight,
            endpoints,
            max_concurrent=profile.max_concurrent if profile is not None else None,
            health_path=profile.launch.health_path if profile is not None else "/health",
            node=str(server.node_id),
        )

    members: dict[int, list[ClusterMember]] = {}
    for member in ClusterMember.objects.filter(server__isnull=False):
        members.setdefault(member.cluster_id, []).append(member)
    bindings: dict[str, list[Binding]] = {}
    for tier in RoutingTier.objects.select_related("capability", "cluster", "server"):
        if tier.cluster is not None:
            found = [
                backend(running[m.server_id], f"{tier.cluster.name}/{m.name}", m.weight)
                for m in members.get(tier.cluster.pk, [])
                if m.server_id in running
            ]
            name, algorithm = tier.cluster.name, tier.cluster.algorithm
            attached = len(members.get(tier.cluster.pk, []))
        else:
            assert tier.server is not None
            found = [backend(tier.server, tier.server.name, tier.weight)]
            name, algorithm, attached = None, Algorithm.WEIGHTED_ROUND_ROBIN, 1
        bindings.setdefault(tier.capability.name, []).append(
            Binding(
                tier.tier, tier.project, name, algorithm, tuple(b for b in found if b is not None), attached
            )
        )
    # A capability that follows another is served by its backends; a cutover moves both in one write.
    follows = dict(Capability.objects.filter(follows__isnull=False).values_list("name", "follows__name"))
    for name, followed in follows.items():
        bindings[name] = bindings.get(followed, [])
    return bindings, follows
