from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from apps.clusters.choices import Algorithm, CredentialKind
from apps.servers.models import ModelServer

CAPABILITY = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}@[1-9][0-9]{0,5}$")
CREDENTIAL_PREFIX = "mfc_"
# A client credential's limits (apps/gateway/limits.py), and its project's defaults for them; null: none.
LIMIT_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrent",
    "tokens_per_day",
    "tokens_per_month",
)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Capability(models.Model):
    """A named, versioned thing clients may call, e.g. ``rag.embedding@1``."""

    name = models.CharField(max_length=80, unique=True, help_text="name@version, e.g. rag.embedding@1")
    description = models.CharField(max_length=200, blank=True)
    follows = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="followers",
        help_text="Served by the other capability's backends: a consumer alias's query name, switched by "
        "its cutover (apps/embedding_migrations).",
    )
    # OpenAI's model object has a creation time (``GET /v1/models``); rows older than the field have the
    # time of the migration that added it.
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "capabilities"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not CAPABILITY.match(self.name):
            raise ValidationError({"name": "Use lower-case name@version, e.g. rag.embedding@1."})


class Cluster(models.Model):
    """Model servers behind one load balancer; the algorithm is a runtime knob."""

    name = models.CharField(max_length=63, unique=True)
    algorithm = models.CharField(
        max_length=32, choices=Algorithm.choices, default=Algorithm.WEIGHTED_ROUND_ROBIN
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def has_servers_attached(self) -> bool:
        """Whether a member has a server attached: membership is then locked (apps.clusters.services)."""
        return self.members.filter(server__isnull=False).exists()


class ClusterMember(models.Model):
    """One slot of a cluster: its name, GPUs, weight, and the model server attached to it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="members")
    name = models.CharField(max_length=63)
    gpus = models.PositiveSmallIntegerField(default=1)
    weight = models.PositiveIntegerField(default=1, help_text="0 parks the member.")
    server = models.OneToOneField(
        ModelServer, null=True, blank=True, on_delete=models.SET_NULL, related_name="cluster_member"
    )

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="clusters_member_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"


class RoutingTier(models.Model):
    """Binds a capability to a cluster or a standalone server; lower ``tier`` is tried first."""

    capability = models.ForeignKey(Capability, on_delete=models.CASCADE, related_name="tiers")
    tier = models.PositiveSmallIntegerField(default=0)
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.CASCADE, related_name="tiers"
    )
    server = models.ForeignKey(
        ModelServer, null=True, blank=True, on_delete=models.CASCADE, related_name="tiers"
    )
    weight = models.PositiveIntegerField(default=1, help_text="Weight of a standalone server.")
    project = models.CharField(max_length=63, blank=True, help_text="Only credentials of this project.")

    class Meta:
        ordering = ["capability", "tier", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(cluster__isnull=False, server__isnull=True)
                | models.Q(cluster__isnull=True, server__isnull=False),
                name="clusters_tier_cluster_xor_server",
            )
        ]

    def __str__(self) -> str:
        return f"{self.capability} tier {self.tier} -> {self.cluster or self.server}"


class ClientCredentialManager(models.Manager["ClientCredential"]):
    def mint(
        self,
        *,
        name: str,
        scopes: list[str],
        project: str = "",
        expires_at: datetime | None = None,
        created_by: Any = None,
        limits: dict[str, int | None] | None = None,
        kind: str = CredentialKind.CLIENT,
    ) -> tuple[ClientCredential, str]:
        plain = CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
        credential = self.create(
            **(limits or {}),
            name=name,
            kind=kind,
            display_prefix=plain[:12],
            secret_hash=digest(plain),
            scopes=sorted(set(scopes)),
            project=project,
            expires_at=expires_at,
            created_by=created_by if getattr(created_by, "pk", None) else None,
        )
        return credential, plain


class ClientCredential(models.Model):
    """What an application presents to the gateway: hashed, expiring, revocable, exactly scoped."""

    name = models.CharField(max_length=100)
    display_prefix = models.CharField(max_length=16, editable=False)
    secret_hash = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.JSONField(default=list, help_text="Exact capability names, e.g. rag.embedding@1.")
    project = models.CharField(max_length=63, blank=True)
    # Playground credentials are the dashboard's own (apps/clusters/playground.py): labelled as such in
    # every list, never minted through the API.
    kind = models.CharField(
        max_length=16, choices=CredentialKind.choices, default=CredentialKind.CLIENT, editable=False
    )
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Limits (apps/gateway/limits.py), held across every gateway process; empty: none.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests in flight at once."
    )
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True, help_text="A budget per UTC day.")
    tokens_per_month = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="A budget per UTC month."
    )

    objects = ClientCredentialManager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.display_prefix}…)"

    def revoke(self) -> bool:
        revoked = bool(
            ClientCredential.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
                revoked_at=timezone.now()
            )
        )
        if revoked:
            # An update sends no post_save: tell the gateways' routing tables, which hold the grants.
            from apps.clusters.bindings import bump_version

            bump_version()
        return revoked


class ProjectLimits(models.Model):
    """Default limits for each client credential of a project: a limit the credential leaves empty is
    the project's (each credential counts its own calls; the project is not a shared pool)."""

    project = models.CharField(max_length=63, unique=True)
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    tokens_per_minute = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    max_concurrent = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Requests in flight at once."
    )
    tokens_per_day = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="A budget per UTC day."
    )
    tokens_per_month = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="A budget per UTC month."
    )

    class Meta:
        ordering = ["project"]
        verbose_name = "project's default limits"
        verbose_name_plural = "projects' default limits"

    def __str__(self) -> str:
        return f"default limits of {self.project}"

    def clean(self) -> None:
        if not self.project.strip():
            raise ValidationError({"project": "Name a project: credentials without one have no defaults."})


def effective_limits(
    credential: ClientCredential, defaults: ProjectLimits | None
) -> dict[str, tuple[int | None, str]]:
    """Each limit that applies to ``credential`` and where it comes from: ``credential`` (its own),
    ``project`` (its project's default, for a limit it leaves empty) or ``""`` (none)."""
    found: dict[str, tuple[int | None, str]] = {}
    for field in LIMIT_FIELDS:
        own = getattr(credential, field)
        if own is not None:
            found[field] = (own, "credential")
        elif defaults is not None and getattr(defaults, field) is not None:
            found[field] = (getattr(defaults, field), "project")
        else:
            found[field] = (None, "")
    return found


def project_defaults(project: str) -> ProjectLimits | None:
    """The default limits of ``project``; none for a credential without a project."""
    return ProjectLimits.objects.filter(project=project).first() if project else None
