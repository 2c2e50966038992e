from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone

from apps.nodes.choices import Accelerator, EventKind, Liveness

CREDENTIAL_PREFIX = "mfn_"
TOKEN_PREFIX = "mfe_"


def digest(secret: str) -> str:
    """Secrets are stored as SHA-256: they are random and long, so a slow hash adds nothing."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _clock(field: str) -> models.Subquery:
    return models.Subquery(ListeningClock.objects.values(field)[:1])


def liveness_now() -> models.Case:
    """A node's liveness as it is now: its column, except that an online or stale node silent since before
    the clock's ``fleet_offline_before`` is offline, and an online node silent since before its
    ``fleet_stale_before`` stale -- a transition that took many nodes at once is held as that one fleet
    state instead of a row version per node (apps.nodes.liveness, bench/heartbeats)."""
    return models.Case(
        models.When(
            liveness__in=[Liveness.ONLINE, Liveness.STALE],
            last_heartbeat_at__lt=_clock("fleet_offline_before"),
            then=models.Value(Liveness.OFFLINE),
        ),
        models.When(
            liveness=Liveness.ONLINE,
            last_heartbeat_at__lt=_clock("fleet_stale_before"),
            then=models.Value(Liveness.STALE),
        ),
        default=models.F("liveness"),
        output_field=models.CharField(),
    )


def liveness_now_sql(offline_before: str, stale_before: str, table: str = "") -> str:
    """``liveness_now()`` as raw SQL, for the sweep's and the heartbeat's own statements: the two limits are
    SQL expressions (a parameter, or a subquery on the clock; NULL when no fleet state is set), ``table``
    the alias the columns are qualified with."""
    col = f"{table}." if table else ""
    return (
        f"(CASE WHEN {col}liveness IN ('{Liveness.ONLINE}', '{Liveness.STALE}')"
        f" AND {col}last_heartbeat_at < {offline_before} THEN '{Liveness.OFFLINE}'"
        f" WHEN {col}liveness = '{Liveness.ONLINE}'"
        f" AND {col}last_heartbeat_at < {stale_before} THEN '{Liveness.STALE}'"
        f" ELSE {col}liveness END)"
    )


class NodeQuerySet(models.QuerySet["Node"]):
    def with_liveness(self) -> NodeQuerySet:
        """Each node with ``liveness_now`` read in the same statement (lists: no query per node)."""
        return self.annotate(_liveness_now=liveness_now())

    def in_liveness(self, *states: str) -> NodeQuerySet:
        """Nodes whose liveness is now one of ``states`` (the fleet's states included)."""
        return self.alias(current_liveness=liveness_now()).filter(current_liveness__in=states)

    def assignable(self, now: datetime | None = None) -> NodeQuerySet:
        """Nodes work may be assigned to: enabled, online, with a heartbeat fresher than the stale limit.

        The one answer later issues rely on; nothing is ever assigned to a node outside it.
        """
        now = now or timezone.now()
        return self.filter(
            enabled=True,
            liveness=Liveness.ONLINE,
            last_heartbeat_at__gte=now - timedelta(seconds=settings.NODE_STALE_AFTER),
        )

    def heard(self, now: datetime | None = None) -> NodeQuerySet:
        """Nodes nobody has reason to think gone: enabled, online, and not silent for longer than the stale
        limit *while the control plane was listening* (after a restore or a restart of the control plane,
        a node's old heartbeat is not its silence). Placement wants a fresh reading (``assignable``).
        Routing used this until issue 48; it now follows the data plane (apps.clusters.bindings)."""
        now = now or timezone.now()
        fresh_after = now - timedelta(seconds=settings.NODE_STALE_AFTER)
        since = ListeningClock.objects.values_list("listening_since", flat=True).first()
        fresh = models.Q(last_heartbeat_at__gte=fresh_after)
        if since is not None and since >= fresh_after:
            fresh = models.Q()
        return self.filter(fresh, enabled=True).in_liveness(Liveness.ONLINE)


class Node(models.Model):
    """A machine running the agent: its identity, what it last reported, and whether work may go there."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63)
    accelerator = models.CharField(max_length=16, choices=Accelerator.choices)
    enabled = models.BooleanField(default=True)
    liveness = models.CharField(max_length=16, choices=Liveness.choices, default=Liveness.PENDING)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    enrolled_at = models.DateTimeField(default=timezone.now)
    credential_hash = models.CharField(max_length=64, editable=False)
    agent_version = models.CharField(max_length=32, blank=True)
    agent_url = models.URLField(max_length=255, blank=True)
    cpu_count = models.PositiveIntegerField(null=True, blank=True)
    load_1m = models.FloatField(null=True, blank=True)
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)
    memory_available_bytes = models.BigIntegerField(null=True, blank=True)
    shm_total_bytes = models.BigIntegerField(null=True, blank=True)
    shm_free_bytes = models.BigIntegerField(null=True, blank=True)
    models_present = models.JSONField(default=list, blank=True)
    secret_mismatch_at = models.DateTimeField(null=True, blank=True)
    agent_reached_at = models.DateTimeField(null=True, blank=True)
    agent_error = models.CharField(max_length=255, blank=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        # No index on liveness or last_heartbeat_at: a heartbeat changes no indexed column, so PostgreSQL
        # updates the row in place (a HOT update) instead of writing an entry into each of the table's
        # five indexes. The sweep reads the whole node table anyway (the mass-loss guard counts every
        # online node). The table's fillfactor is 50 (migration 0005): every row of a page has room for
        # a new version on the same page, so a sweep that moves a whole fleet at once is HOT too
        # (bench/heartbeats, 2026-12-01: the all-due sweep 107-121 -> 66 ms at 10,000 nodes, heartbeats
        # no slower since they are written in batches; refused on 2026-11-30, before the batches).
        # The two unique columns are constraints, not ``unique=True``: on PostgreSQL that also builds a
        # ``varchar_pattern_ops`` index per column for ``LIKE 'x%'`` (nothing here asks one: names are
        # searched with ``icontains``), two more index entries for every row a sweep moves.
        constraints = [
            models.UniqueConstraint(fields=["name"], name="nodes_node_name_key"),
            models.UniqueConstraint(fields=["credential_hash"], name="nodes_node_credential_hash_key"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def liveness_now(self) -> str:
        """The column, or the fleet's state the node is in (``liveness_now()``); read in the same statement
        when the node came from ``with_liveness()``."""
        known: str | None = self.__dict__.get("_liveness_now")
        if known is not None:
            return known
        if self.liveness not in (Liveness.ONLINE, Liveness.STALE) or self.last_heartbeat_at is None:
            return self.liveness
        held = ListeningClock.objects.values_list("fleet_offline_before", "fleet_stale_before").first()
        offline, stale = held if held is not None else (None, None)
        if offline is not None and self.last_heartbeat_at < offline:
            return Liveness.OFFLINE
        if self.liveness == Liveness.ONLINE and stale is not None and self.last_heartbeat_at < stale:
            return Liveness.STALE
        return self.liveness

    def is_assignable(self, now: datetime | None = None) -> bool:
        return Node.objects.filter(pk=self.pk).assignable(now).exists()

    def set_enabled(self, enabled: bool, by: str) -> bool:
        """Enable or disable; an event row records who. Returns whether anything changed."""
        changed = Node.objects.filter(pk=self.pk, enabled=not enabled).update(enabled=enabled)
        if changed:
            self.enabled = enabled
            NodeEvent.objects.create(
                node=self, kind=EventKind.ENABLED if enabled else EventKind.DISABLED, detail=f"by {by}"
            )
        return bool(changed)


class GPU(models.Model):
    """One GPU of a node as last reported: memory split into ModelForge-managed, external, free."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=96)
    name = models.CharField(max_length=128)
    memory_total_bytes = models.BigIntegerField()
    memory_used_bytes = models.BigIntegerField()
    memory_managed_bytes = models.BigIntegerField()
    utilization_percent = models.PositiveSmallIntegerField()
    temperature_c = models.SmallIntegerField()
    reported_at = models.DateTimeField()

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="nodes_gpu_one_per_index")]

    def __str__(self) -> str:
        return f"{self.node_id} GPU {self.index} ({self.name})"

    @property
    def memory_external_bytes(self) -> int:
        """External pressure: used by processes ModelForge did not start (observed, never reclaimed)."""
        return max(0, self.memory_used_bytes - self.memory_managed_bytes)

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_used_bytes)

    def shares(self) -> dict[str, float]:
        """Percentages of total memory for the dashboard's bar."""
        total = self.memory_total_bytes or 1
        return {
            "managed": 100 * self.memory_managed_bytes / total,
            "external": 100 * self.memory_external_bytes / total,
            "free": 100 * self.memory_free_bytes / total,
        }


class NodeEvent(models.Model):
    """A transition in a node's life: enrollment, liveness changes, enable/disable, secret mismatches.

    A liveness transition that moved many nodes at once (the mass-loss guard's "many", the same that
    raises one alert for the fleet) is ONE row naming them all in ``nodes`` (``node`` empty): a whole
    fleet's worth of rows was most of such a sweep's time. ``events_of(node)`` reads both kinds."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events", null=True, blank=True)
    # A fleet event: every node it moved (ids; a node deleted later stays named here, as in an alert).
    nodes = ArrayField(models.UUIDField(), null=True, blank=True, editable=False)
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    from_liveness = models.CharField(max_length=16, blank=True)
    to_liveness = models.CharField(max_length=16, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        who = self.node_id if self.node_id is not None else f"{len(self.nodes or [])} nodes"
        return f"{who} {self.kind} {self.from_liveness}->{self.to_liveness}"

    @property
    def fleet_size(self) -> int | None:
        """How many nodes a fleet event moved; None for a node's own event."""
        return len(self.nodes) if self.nodes is not None else None


def events_of(node: Node) -> models.QuerySet[NodeEvent]:
    """A node's history: its own events and the fleet events that moved it, newest first."""
    return NodeEvent.objects.filter(
        models.Q(node=node) | models.Q(node__isnull=True, nodes__contains=[node.pk])
    )


class EnrollmentTokenManager(models.Manager["EnrollmentToken"]):
    def mint(
        self, *, note: str = "", ttl_seconds: int | None = None, created_by: Any = None
    ) -> tuple[EnrollmentToken, str]:
        """A new single-use token; the plain value is returned once and only its digest is kept."""
        plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
        ttl = ttl_seconds or settings.ENROLLMENT_TOKEN_TTL
        token = self.create(
            token_hash=digest(plain),
            display_prefix=plain[:10],
            note=note,
            expires_at=timezone.now() + timedelta(seconds=ttl),
            created_by=created_by if getattr(created_by, "pk", None) else None,
        )
        return token, plain


class EnrollmentToken(models.Model):
    """A single-use, expiring permission for one agent to enroll; stored as a digest, shown once."""

    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    display_prefix = models.CharField(max_length=16, editable=False)
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    node = models.OneToOneField(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="enrollment_token"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = EnrollmentTokenManager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.display_prefix}… ({self.state})"

    @property
    def state(self) -> str:
        if self.used_at:
            return "used"
        if self.revoked_at:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "usable"

    def revoke(self) -> bool:
        return bool(
            EnrollmentToken.objects.filter(pk=self.pk, used_at__isnull=True, revoked_at__isnull=True).update(
                revoked_at=timezone.now()
            )
        )


class ListeningClock(models.Model):
    """When the control plane could hear its nodes, and the mass-loss hold (one row).

    A node's silence is counted from ``max(last heartbeat, listening_since)``: ``listening_since`` moves
    forward whenever the control plane could not have received heartbeats (web processes back after a
    gap, sweeps resuming after the worker, beat, broker or database were away, a restore's switch-over).
    A restored database carries an old row, which the first web stamp or sweep recognises as a gap.
    """

    singleton = models.BooleanField(default=True, unique=True, editable=False)
    listening_since = models.DateTimeField(null=True, blank=True)
    listening_reason = models.CharField(max_length=255, blank=True)
    web_seen_at = models.DateTimeField(null=True, blank=True)
    swept_at = models.DateTimeField(null=True, blank=True)
    hold_since = models.DateTimeField(null=True, blank=True)
    hold_nodes = models.PositiveIntegerField(default=0)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    confirmed_by = models.CharField(max_length=150, blank=True)
    # Online nodes silent since before ``fleet_stale_before`` are stale, online and stale nodes silent since
    # before ``fleet_offline_before`` offline: a transition that took many nodes at once (the mass-loss
    # guard's "many") is written here, once, instead of as a row version per node (``liveness_now``).
    fleet_stale_before = models.DateTimeField(null=True, blank=True)
    fleet_offline_before = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(singleton=True), name="nodes_listening_singleton"),
        ]

    def __str__(self) -> str:
        return f"listening since {self.listening_since}"
