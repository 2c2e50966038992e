"""The routing table each web process caches, and the balancers that pick a backend from it.

The table (credentials, capabilities, tiers, clusters, running servers) is read from the database in a
few queries and kept in memory: the data path reads it and nothing else, no database, no Redis. A
refresher thread per process keeps it current, off the request path:

1. It listens for the routing version's change notice (Redis pub/sub on ``CHANGED_CHANNEL``, published
   by every ``bump_version``) and rebuilds the table as soon as one arrives.
2. Every ``CHECK_EVERY_S`` without a notice it reads the version anyway (a notice lost while its
   connection was down) and rebuilds when it moved, or when the table is ``REBUILD_AT_LEAST_EVERY_S``
   old (what no notice reports: a node disabled or silent, a row changed without a signal; Redis away) and
   what it was built from changed: ``inputs`` (a short statement per configuration table, one over the
   enabled nodes) says so. Rebuilding every few seconds regardless put some 12 ms of CPU on the core the
   engines share, every 5 s: at the low rates of LLM traffic, the gateway's largest added time to first
   token (bench/gateway/engine.py).
3. The database away: the last table stays in use, and the next check tries again.

Only a process that has no table yet builds one on a request (its first, before the refresher has).
In-flight counts (requests and estimated tokens) reach the other processes through the load-balancer
state's once-a-second flush (apps/gateway/lbstate.py); smooth round-robin state is each process's own,
and prefix affinity needs none (every process builds the same ring: apps/gateway/affinity.py).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from apps.clusters.bindings import (
    CHANGED_CHANNEL,
    REBUILD_AT_LEAST_EVERY_S,
    VERSION_KEY,
    Backend,
    Binding,
    bump_version,
    read_bindings,
    routing_redis,
)
from apps.clusters.models import (
    Algorithm,
    Capability,
    ClientCredential,
    Cluster,
    ClusterMember,
    ProjectLimits,
    RoutingTier,
    digest,
    effective_limits,
)
from apps.embedding_migrations.models import EmbeddingSpace
from apps.gateway.affinity import Ask, Rings, bounded_pick
from apps.gateway.limits import Limits
from apps.servers.models import ModelServer

logger = logging.getLogger("modelforge.gateway")

NOT_KNOWN = "The credential is not known."

# The refresher's version check without a notice (the fallback), and its wait between tries of Redis.
CHECK_EVERY_S = 1.0


# The rows the table is built from (a server's state change has a signal of its own).
ROUTED_MODELS = (
    Capability,
    Cluster,
    ClusterMember,
    RoutingTier,
    ClientCredential,
    ProjectLimits,
    ModelServer,
)


def routing_changed(sender: Any, **kwargs: Any) -> None:
    """A configuration row the table is built from was saved or deleted (connected in GatewayConfig.ready)."""
    if sender in (
        Capability,
        Cluster,
        ClusterMember,
        RoutingTier,
        ClientCredential,
        ProjectLimits,
        ModelServer,
    ):
        bump_version()


def server_state_changed(sender: Any, **kwargs: Any) -> None:
    """A server moved state (connected in GatewayConfig.ready)."""
    bump_version()


@dataclass(frozen=True)
class Grant:
    """What a presented credential may do, and why it may not (the message of a refusal)."""

    secret_hash: str
    scopes: frozenset[str]
    project: str
    expires_at: datetime | None
    revoked: bool
    id: str = ""  # the credential's id, for usage and limits
    limits: Limits | None = None  # None: no limit, and no Redis round trip


@dataclass
class Table:
    grants: dict[str, Grant]
    bindings: dict[str, list[Binding]]
    # The embedding space key per capability (apps/embedding_migrations), sent back with embeddings.
    spaces: dict[str, str] = field(default_factory=dict)
    # Each capability's creation time (Unix seconds), for OpenAI's model objects.
    created: dict[str, int] = field(default_factory=dict)
    built_at: float = field(default_factory=time.monotonic)
    # What it was built from (``inputs``, read before the build): the same later, no rebuild is needed.
    inputs: Any = field(default=None, repr=False, compare=False)
    # Candidates per (capability, project), computed once per table: a table never changes once built.
    candidates: dict[tuple[str, str], tuple[list[Backend], str, str | None]] = field(
        default_factory=dict, repr=False, compare=False
    )


# Every configuration row the table is built from, summarised: per table its row count and the sum of its
# rows' transaction ids (``xmin`` moves with every insert and update, the count with every delete). A row
# changed without a signal (a queryset ``update``), a restore: the sum moves. One statement per table, each
# its own transaction: a statement over all of them would hold some tables' locks while it waited for
# another's, and deadlock with a TRUNCATE or other DDL taking them in another order (CI, 2026-12-02).
# Nodes are summarised apart (``inputs``): their rows change with every heartbeat, and only which are
# enabled, their addresses and whether their agent is silent make the table.
_CONFIGURATION = [
    f"SELECT count(*), coalesce(sum(xmin::text::bigint), 0) FROM {model._meta.db_table}"  # noqa: S608
    for model in (
        ClientCredential,
        ProjectLimits,
        Capability,
        Cluster,
        ClusterMember,
        RoutingTier,
        ModelServer,
        EmbeddingSpace,
    )
]


def inputs() -> tuple[tuple[tuple[int, int], ...], frozenset[tuple[Any, str, bool]]]:
    """What ``build_table`` reads, in short statements: unchanged, the table it builds is the same."""
    from apps.nodes.choices import Liveness
    from apps.nodes.models import Node, liveness_now

    configuration = []
    with connection.cursor() as cursor:
        for statement in _CONFIGURATION:
            cursor.execute(statement)
            n, total = cursor.fetchone()
            configuration.append((int(n), int(total)))
    # The enabled nodes, their addresses, and which are silent (a server failed NODE_OFFLINE is routed only
    # while its node is: apps.clusters.bindings.management_lost).
    nodes = frozenset(
        (pk, url, now in (Liveness.STALE, Liveness.OFFLINE))
        for pk, url, now in Node.objects.filter(enabled=True)
        .annotate(now=liveness_now())
        .values_list("pk", "agent_url", "now")
    )
    return tuple(configuration), nodes


def build_table() -> Table:
    """Read everything routing needs, in a handful of queries."""
    defaults = {p.project: p for p in ProjectLimits.objects.all()}
    grants = {
        c.secret_hash: Grant(
            c.secret_hash,
            frozenset(c.scopes),
            c.project,
            c.expires_at,
            c.revoked_at is not None,
            str(c.pk),
            _limits(c, defaults.get(c.project) if c.project else None),
        )
        for c in ClientCredential.objects.all()
    }
    bindings, follows = read_bindings()
    spaces = {s.capability.name: s.key for s in EmbeddingSpace.objects.select_related("capability")}
    # A follower answers in the space of the capability it follows.
    for name, followed in follows.items():
        if followed in spaces:
            spaces[name] = spaces[followed]
        else:
            spaces.pop(name, None)
    created = {name: int(at.timestamp()) for name, at in Capability.objects.values_list("name", "created_at")}
    return Table(grants, bindings, spaces, created)


def _limits(credential: ClientCredential, defaults: ProjectLimits | None) -> Limits | None:
    """The credential's limits, each of its own or else its project's default; None when none applies."""
    limits = Limits(**{field: value for field, (value, _) in effective_limits(credential, defaults).items()})
    return limits if limits.any() else None


class Router:
    """One per process: the cached table, its refresher, and the balancers' state."""

    def __init__(self) -> None:
        self._table: Table | None = None
        self._version: Any = None
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()  # one build at a time: the refresher's, or a first request's
        self._current: dict[tuple[str, ...], dict[str, int]] = {}  # smooth WRR state per candidate set
        self.rings = Rings()  # prefix affinity's ring per candidate set (apps/gateway/affinity.py)
        self._refresher: threading.Thread | None = None
        self._stop = threading.Event()
        self.redis_ok = True
        self.notices = 0  # change notices received (the tests and the bench read it)
        self.rebuilds = 0
        self.unchanged = 0  # checks that found the table's inputs unchanged (no rebuild)

    def current(self) -> Table | None:
        """The cached table, as the refresher keeps it (the gateway's hot path: an attribute read)."""
        return self._table

    async def table(self) -> Table:
        """The cached table; built on this request only when the process has none yet (off the event loop:
        the ORM is synchronous), and the refresher started."""
        table = self._table
        if table is None:
            table = await sync_to_async(self.first_table, thread_sensitive=False)()
        return table

    async def caught_up(self, older_than: float | None = None) -> Table:
        """The table after a version check made now, rebuilt if it moved: for a refusal that a change the
        refresher has not picked up yet could explain (a credential minted a moment ago, its notice still
        on the way), checked before the refusal is given. A version read when nothing changed, and a
        rebuild if the table is ``older_than`` seconds old (what no version reports: a node enabled again
        by a queryset update)."""
        return await sync_to_async(self._catch_up, thread_sensitive=False)(older_than)

    def _catch_up(self, older_than: float | None = None) -> Table:
        with self._build_lock:
            table = self.refresh(older_than)
        if self._refresher is None:
            self.start()
        return table

    def first_table(self) -> Table:
        with self._build_lock:
            table = self._table or self.refresh()
        self.start()
        return table

    def start(self) -> None:
        """Start this process's refresher (idempotent): from ``web_worker_started``, else the first
        request."""
        with self._build_lock:
            if self._refresher is not None and self._refresher.is_alive():
                return
            self._stop.clear()
            self._refresher = threading.Thread(
                target=self._refresh_forever, name="modelforge-routing", daemon=True
            )
            self._refresher.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the refresher (tests); the table stays."""
        self._stop.set()
        refresher, self._refresher = self._refresher, None
        if refresher is not None:
            refresher.join(timeout)

    def _forget_after_fork(self) -> None:
        # A forked child has none of the parent's threads: it builds its own table and refresher.
        self._table, self._version, self._refresher = None, None, None
        self._lock, self._build_lock, self._stop = threading.Lock(), threading.Lock(), threading.Event()

    def _refresh_forever(self) -> None:
        subscription: Any = None
        while not self._stop.is_set():
            if subscription is None:
                # (Re)subscribe, then check at once: a notice sent while there was no subscription is lost.
                subscription = self._subscribe()
                if subscription is None and self._table is not None:
                    self._stop.wait(CHECK_EVERY_S)  # Redis away: the version check below says so
            else:
                try:
                    self._await_notice(subscription)
                except (redis.RedisError, OSError):
                    subscription = self._unsubscribe(subscription)
            if self._stop.is_set():
                break
            try:
                with self._build_lock:
                    self.refresh()
            except Exception as exc:  # no table yet and the database away: try again at the next check
                logger.warning("routing table not built (%s): trying again in %.0f s", exc, CHECK_EVERY_S)
                self._stop.wait(CHECK_EVERY_S)
            if not self.redis_ok and subscription is not None:
                subscription = self._unsubscribe(subscription)
        if subscription is not None:
            self._unsubscribe(subscription)
        connection.close()  # this thread's; a stopped refresher holds no database session

    def _subscribe(self) -> Any:
        try:
            subscription = routing_redis().pubsub(ignore_subscribe_messages=True)
            subscription.subscribe(CHANGED_CHANNEL)
            return subscription
        except (redis.RedisError, OSError):
            return None

    @staticmethod
    def _unsubscribe(subscription: Any) -> None:
        with contextlib.suppress(redis.RedisError, OSError):
            subscription.close()

    def _await_notice(self, subscription: Any) -> None:
        """Wait up to ``CHECK_EVERY_S`` for a change notice; take every one already queued with it (a burst
        of changes, one rebuild)."""
        deadline = time.monotonic() + CHECK_EVERY_S
        while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
            # One wait for the whole second, not four: each wake-up of redis-py's pubsub costs about as
            # much as the version check (bench/gateway/idle.py, 2026-12-04); ``stop`` waits for it.
            message = subscription.get_message(timeout=left)
            if message is not None and message.get("type") == "message":
                self.notices += 1
                while subscription.get_message(timeout=0) is not None:
                    self.notices += 1
                return

    def refresh(self, older_than: float | None = None) -> Table:
        """Check the routing version and rebuild the table when it moved or is ``older_than`` seconds old
        (the refresher's step, or a first request's build). Returns the table in use."""
        now = time.monotonic()
        version = self._version
        try:
            version = routing_redis().get(VERSION_KEY)
            if not self.redis_ok:
                logger.warning("Redis reachable again: routing versions are followed")
            self.redis_ok = True
        except redis.RedisError as exc:
            if self.redis_ok:
                logger.warning(
                    "Redis unreachable (%s): routing continues on this process's table, rebuilt every %.0f s",
                    type(exc).__name__,
                    REBUILD_AT_LEAST_EVERY_S,
                )
            self.redis_ok = False
        table = self._table
        if older_than is None:
            older_than = REBUILD_AT_LEAST_EVERY_S
        if table is None or now - table.built_at > older_than or version != self._version:
            try:
                read = inputs()
                if table is not None and version == self._version and read == table.inputs:
                    table.built_at = now  # only older: what it is built from has not changed
                    self.unchanged += 1
                    return table
                table = self._table = build_table()
                table.inputs = read
                self.rebuilds += 1
            except (DatabaseError, psycopg.Error) as exc:
                if table is None:
                    raise
                # The database away (a restore's switch-over, a restart): keep routing on the table this
                # process has, and try again at the next check.
                logger.warning(
                    "routing table not rebuilt, database unavailable (%s): serving the last one", exc
                )
                table.built_at = now
                return table
            finally:
                close_old_connections()
            self._version = version
        return table

    def candidates_in(
        self, table: Table, capability: str, project: str
    ) -> tuple[list[Backend], str, str | None]:
        found = table.candidates.get((capability, project))
        if found is None:
            found = self._candidates(table, capability, project)
            if len(table.candidates) < 4096:  # bounded: projects are named by credentials, not callers
                table.candidates[(capability, project)] = found
        return found

    def _candidates(
        self, table: Table, capability: str, project: str, skip: frozenset[str] = frozenset()
    ) -> tuple[list[Backend], str, str | None]:
        """The backends of the first tier that has any for this project; the algorithm to use; the
        cluster name when one cluster alone serves (None: mixed, weighted round-robin). ``skip``: backends
        that do not count (the ones failing their probes: a tier of only those passes to the next)."""
        bindings = [b for b in table.bindings.get(capability, []) if b.project in ("", project)]
        for tier in sorted({b.tier for b in bindings}):
            in_tier = [b for b in bindings if b.tier == tier and b.backends]
            if skip:
                in_tier = [b for b in in_tier if any(x.key not in skip for x in b.backends)]
            if not in_tier:
                continue
            if len(in_tier) == 1 and in_tier[0].cluster is not None:
                return list(in_tier[0].backends), in_tier[0].algorithm, in_tier[0].cluster
            # Candidates span clusters or include a standalone server: combining two clusters'
            # algorithms has no principled answer, so weighted round-robin it is.
            return [b for binding in in_tier for b in binding.backends], Algorithm.WEIGHTED_ROUND_ROBIN, None
        return [], Algorithm.WEIGHTED_ROUND_ROBIN, None

    def next_tier(
        self, table: Table, capability: str, project: str, skip: frozenset[str]
    ) -> tuple[list[Backend], str, str | None]:
        """The candidates when every backend in ``skip`` is out (the slow path of a request whose tier has
        no backend answering its probes): the next tier that has another."""
        return self._candidates(table, capability, project, skip)

    def backends(self) -> list[Backend]:
        """Every backend of the current table, once each (what the prober probes)."""
        table = self._table
        found: dict[str, Backend] = {}
        if table is not None:
            for bindings in table.bindings.values():
                for binding in bindings:
                    for backend in binding.backends:
                        found.setdefault(backend.key, backend)
        return list(found.values())

    def pick(
        self,
        backends: list[Backend],
        algorithm: str,
        exclude: set[str] | None = None,
        ask: Ask | None = None,
        ring_of: list[Backend] | None = None,
    ) -> Backend | None:
        """A backend of ``backends`` (less ``exclude``) by ``algorithm``. ``ask``: what the request says of
        itself (its prefix's point, its estimated tokens), for the algorithms that use it; ``ring_of``: every
        candidate, usable or not, whose ring the prefix is placed on (default ``backends``)."""
        choices = [b for b in backends if b.key not in exclude] if exclude else backends
        if not choices:
            return None
        if algorithm == Algorithm.WEIGHTED_ROUND_ROBIN:
            return self._smooth_wrr(choices)
        from apps.gateway.lbstate import shared

        if algorithm == Algorithm.LEAST_CONNECTIONS:
            return min(choices, key=lambda b: (shared.in_flight_estimate(b.key) / b.weight, -b.weight, b.key))
        if algorithm == Algorithm.LEAST_OUTSTANDING:
            if len(shared.engines_wanted) < len(choices):
                shared.wants_engines(choices)  # their engines' own counts, read at the next flush
            work = shared.outstanding_estimate
            return min(choices, key=lambda b: (work(b.key) / b.weight, -b.weight, b.key))
        if algorithm == Algorithm.PREFIX_AFFINITY and ask is not None and ask.point is not None:
            ring = self.rings.of(ring_of or backends)
            backend, home = bounded_pick(
                ring, ask.point, choices, shared.in_flight_estimate, settings.GATEWAY_AFFINITY_LOAD_CAP_PCT
            )
            if backend is not None:
                shared.routed_by_prefix(backend.key, home)
                return backend
        return self._smooth_wrr(choices)

    def _smooth_wrr(self, choices: list[Backend]) -> Backend:
        """nginx's smooth weighted round-robin: shares hold over short windows, no bursts."""
        if len(choices) == 1:
            return choices[0]  # one candidate: nothing to balance, no state to keep
        key = tuple(b.key for b in choices)
        with self._lock:
            current = self._current.setdefault(key, {})
            total = 0
            best: Backend | None = None
            for b in choices:
                current[b.key] = current.get(b.key, 0) + b.weight
                total += b.weight
                if best is None or current[b.key] > current[best.key]:
                    best = b
            assert best is not None
            current[best.key] -= total
            return best


def authorize(
    table: Table, presented: str | None, capability: str | None, *, now: datetime | None = None
) -> tuple[Grant | None, str]:
    """The grant for ``presented`` if it may call ``capability`` (exact match), else a reason."""
    if not presented:
        return None, "A client credential is required: Authorization: Bearer <credential>."
    if not presented.startswith("mfc_") or len(presented) > 200:
        return None, "The credential is malformed."
    wanted = digest(presented)
    grant = table.grants.get(wanted)
    if grant is None or not hmac.compare_digest(grant.secret_hash, wanted):
        return None, NOT_KNOWN
    if grant.revoked:
        return None, "The credential was revoked."
    if grant.expires_at is not None and grant.expires_at <= (now or timezone.now()):
        return None, "The credential has expired."
    if capability is not None and capability not in grant.scopes:
        # Exact: rag.embedding@1 does not grant @2; whitespace or case never widens a scope.
        return None, f"The credential is not scoped to {capability!r}."
    return grant, ""


def not_bound_for(table: Table, capability: str, project: str) -> str | None:
    """Why ``capability`` is refused to a credential of ``project``, when every binding it has belongs to
    another project; ``None`` when some binding is this project's or unbound.

    Seeds, under ``401 CAPABILITY_NOT_AUTHORIZED``: "a project-bound client cannot serve another
    project's binding" — a credential problem, so the same status and code as the others, not a 503.
    Asked only when no backend was found, so the data path pays nothing for it."""
    bindings = table.bindings.get(capability, [])
    if not bindings or any(b.project in ("", project) for b in bindings):
        return None
    if not project:
        return (
            f"{capability!r} is bound only for projects; this credential has no project, and a client "
            "cannot serve another project's binding."
        )
    return (
        f"{capability!r} is not bound for project {project!r}: a project-bound client cannot serve another "
        "project's binding."
    )


def detached_clusters(table: Table, capability: str, project: str) -> tuple[list[str], bool]:
    """The clusters bound to ``capability`` for ``project`` with no server attached (``'name' (tier n)``),
    and whether they are all it is bound to. Asked only when no backend was found (the refusal's message),
    so the data path pays nothing for it."""
    bindings = [b for b in table.bindings.get(capability, []) if b.project in ("", project)]
    detached = [
        f"{b.cluster!r} (tier {b.tier})" for b in bindings if b.cluster is not None and not b.attached
    ]
    return detached, bool(detached) and len(detached) == len(bindings)


router = Router()
os.register_at_fork(after_in_child=router._forget_after_fork)
