from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django.core.exceptions import ObjectDoesNotExist
from django.core.validators import RegexValidator
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.validators import UniqueValidator

from apps.clusters import services
from apps.clusters.models import (
    CAPABILITY,
    LIMIT_FIELDS,
    Capability,
    ClientCredential,
    Cluster,
    ClusterMember,
    ProjectLimits,
    RoutingTier,
)
from apps.servers.models import ModelServer
from modelforge.errors import codes
from modelforge.validators import PrintableText

# Capabilities are matched exactly, so they are written exactly: no spaces, lower case, @version. A
# RegexValidator, so that the OpenAPI schema states the pattern too.
exact_capability = RegexValidator(
    CAPABILITY, message="%(value)r is not name@version in lower case, e.g. rag.embedding@1."
)


class CapabilitySerializer(PrintableText, serializers.ModelSerializer):
    # Declared, so the model's unique check is named here: without it a taken name was an IntegrityError,
    # a 500 (found by bench/fuzz).
    name = serializers.CharField(
        max_length=80,
        validators=[
            exact_capability,
            UniqueValidator(Capability.objects.all(), message="A capability with this name exists."),
        ],
        trim_whitespace=False,
    )

    follows: serializers.SlugRelatedField[Capability] = serializers.SlugRelatedField(
        slug_field="name",
        read_only=True,
        allow_null=True,
        help_text="Set for a consumer alias's query name: served by this capability's backends.",
    )
    embedding_space = serializers.SerializerMethodField(
        help_text="The recorded embedding space (model, revision, dimension, normalisation, pooling, key)."
    )

    class Meta:
        model = Capability
        fields = ["id", "name", "description", "follows", "embedding_space"]

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_embedding_space(self, capability: Capability) -> dict[str, Any] | None:
        target = capability.follows or capability
        try:
            space = target.embedding_space
        except ObjectDoesNotExist:
            return None
        return {**space.identity(), "key": space.key}


class ClusterMemberSerializer(PrintableText, serializers.ModelSerializer):
    class Meta:
        model = ClusterMember
        fields = ["id", "cluster", "name", "gpus", "weight", "server"]
        read_only_fields = ["server"]


class ClusterSerializer(PrintableText, serializers.ModelSerializer):
    members = ClusterMemberSerializer(many=True, read_only=True)
    servers_attached = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = ["id", "name", "algorithm", "members", "servers_attached"]

    def get_servers_attached(self, cluster: Cluster) -> bool:
        return any(m.server_id for m in cluster.members.all())


class ClusterCreateSerializer(ClusterSerializer):
    """A new cluster, optionally built from servers in one step."""

    servers = serializers.PrimaryKeyRelatedField(
        queryset=ModelServer.objects.all(),
        many=True,
        write_only=True,
        required=False,
        help_text="A member per server (named after it, its GPUs, weight 1), each attached, in one step. "
        "Servers that failed, stopped or serve another member are refused, and nothing is written.",
    )

    class Meta(ClusterSerializer.Meta):
        fields = [*ClusterSerializer.Meta.fields, "servers"]

    def validate_servers(self, servers: list[ModelServer]) -> list[ModelServer]:
        if len({s.pk for s in servers}) != len(servers):
            raise serializers.ValidationError("a server is listed twice.")
        for server in servers:
            if server.state in ("failed", "stopped", "stopping"):
                raise serializers.ValidationError(f"{server.name} is {server.state}.")
            if ClusterMember.objects.filter(server=server).exists():
                raise serializers.ValidationError(f"{server.name} already serves a member.")
        return servers

    def create(self, validated_data: dict[str, Any]) -> Cluster:
        return services.create_cluster(**validated_data)


class RoutingTierSerializer(PrintableText, serializers.ModelSerializer):
    # Exactly one of a cluster and a server (validate() below): oneOf holds when just one of them is
    # given and not null. A PATCH is judged with the tier's stored binding, which a schema cannot see:
    # stated for whole bodies only.
    openapi_rules: ClassVar[dict[str, Any]] = {
        "oneOf": [
            {"required": ["cluster"], "properties": {"cluster": {"type": "integer"}}},
            {"required": ["server"], "properties": {"server": {"type": "string", "format": "uuid"}}},
        ]
    }

    class Meta:
        model = RoutingTier
        fields = ["id", "capability", "tier", "cluster", "server", "weight", "project"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        cluster = attrs.get("cluster", getattr(self.instance, "cluster", None))
        server = attrs.get("server", getattr(self.instance, "server", None))
        if (cluster is None) == (server is None):
            raise serializers.ValidationError(
                "Bind the tier to exactly one of a cluster or a standalone server."
            )
        return attrs


# Bounded by their columns: a value past one is a 400 naming the field, not the database's error.
_LIMIT_MAX = {
    "requests_per_minute": 2**31 - 1,
    "tokens_per_minute": 2**63 - 1,
    "max_concurrent": 2**31 - 1,
    "tokens_per_day": 2**63 - 1,
    "tokens_per_month": 2**63 - 1,
}
LIMIT_BOUNDS: dict[str, dict[str, Any]] = {
    f: {"min_value": 1, "max_value": _LIMIT_MAX[f]} for f in LIMIT_FIELDS
}


class LimitsSerializer(serializers.ModelSerializer):
    """``POST /client-credentials/{id}/limits``: every limit, each a whole number from 1 or null (none)."""

    class Meta:
        model = ClientCredential
        fields = list(LIMIT_FIELDS)
        extra_kwargs = {f: {**LIMIT_BOUNDS[f], "required": True, "allow_null": True} for f in LIMIT_FIELDS}


class ProjectLimitsSerializer(PrintableText, serializers.ModelSerializer):
    """A project's default limits: each applies to every credential of the project that leaves that limit
    empty. Each a whole number from 1, or null (no default)."""

    trimmed_fields = ("project",)  # validate_project

    project = serializers.CharField(
        max_length=63,
        trim_whitespace=False,
        validators=[
            UniqueValidator(
                ProjectLimits.objects.all(),
                message="This project has default limits already: change them with "
                "PUT /api/v1/project-limits/{id} (or on the dashboard's Project limits page).",
            )
        ],
        help_text="The project, as credentials name it.",
    )

    class Meta:
        model = ProjectLimits
        fields = ["id", "project", *LIMIT_FIELDS]
        extra_kwargs = {f: {**LIMIT_BOUNDS[f], "allow_null": True} for f in LIMIT_FIELDS}

    def validate_project(self, value: str) -> str:
        if not value.strip() or value != value.strip():
            raise serializers.ValidationError(
                "Name a project exactly, without surrounding spaces (credentials without one have no "
                "defaults)."
            )
        return value


class CredentialUseSerializer(serializers.Serializer):
    requests_last_minute = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    tokens_this_minute = serializers.IntegerField()
    tokens_today = serializers.IntegerField()
    tokens_this_month = serializers.IntegerField()
    limits_enforced = serializers.BooleanField(help_text="False while Redis cannot be read.")
    limits = serializers.DictField(
        child=serializers.IntegerField(allow_null=True),
        help_text="Each limit that applies: the credential's own, else its project's default; null: none.",
    )
    limits_from = serializers.DictField(
        child=serializers.ChoiceField(choices=["credential", "project", ""]),
        help_text="Where each applied limit comes from: credential, project (its default), or empty (none).",
    )


class ClientCredentialSerializer(PrintableText, serializers.ModelSerializer):
    # validate_expires_at: the clock, which no schema can state (modelforge.autoschema).
    openapi_state_refusals: ClassVar[dict[str, int]] = {codes.EXPIRY_IN_PAST: 400}
    scopes = serializers.ListField(
        child=serializers.CharField(max_length=80, validators=[exact_capability], trim_whitespace=False),
        allow_empty=False,
        min_length=1,  # the same rule, in the words the OpenAPI schema states (minItems)
        max_length=100,
    )

    class Meta:
        model = ClientCredential
        fields = [
            "id",
            "name",
            "display_prefix",
            "scopes",
            "project",
            "kind",
            "created_at",
            "expires_at",
            "revoked_at",
            *LIMIT_FIELDS,
        ]
        # ``playground``: minted by the dashboard's Playground, never through the API.
        read_only_fields = ["display_prefix", "kind", "created_at", "revoked_at"]
        extra_kwargs = LIMIT_BOUNDS

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        # Minted already expired, it would be refused at its first use with nothing to say it never worked.
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError(
                "Give a time in the future: a credential is not minted expired.", code=codes.EXPIRY_IN_PAST
            )
        return value

    def mint(self, created_by: Any) -> tuple[ClientCredential, str]:
        """The credential and its plain value (shown once), from the validated data."""
        return ClientCredential.objects.mint(
            name=self.validated_data["name"],
            scopes=self.validated_data["scopes"],
            project=self.validated_data.get("project", ""),
            expires_at=self.validated_data.get("expires_at"),
            created_by=created_by,
            limits={f: self.validated_data[f] for f in LIMIT_FIELDS if f in self.validated_data},
        )


class MintedCredentialSerializer(ClientCredentialSerializer):
    credential = serializers.CharField(read_only=True, help_text="Shown once; only its digest is stored.")

    class Meta(ClientCredentialSerializer.Meta):
        fields = [*ClientCredentialSerializer.Meta.fields, "credential"]


class AttachSerializer(serializers.Serializer):
    """``POST /cluster-members/{id}/attach``: the model server to attach."""

    server = serializers.UUIDField(help_text="The id of an existing model server.")


class BenchSerializer(serializers.Serializer):
    since = serializers.FloatField(help_text="Unix time.")
    until = serializers.FloatField(help_text="Unix time.")
    reason = serializers.CharField()
    count = serializers.IntegerField(help_text="Benches in the window.")
    remaining_s = serializers.FloatField()


class BackendProbeSerializer(serializers.Serializer):
    state = serializers.ChoiceField(
        choices=["up", "down", "unknown"],
        help_text="The gateway's health probe of the backend: down when a gateway process finds it down "
        "(it gets no traffic); unknown when none probed it in the last few seconds.",
    )
    since = serializers.FloatField(allow_null=True, help_text="Unix time the state began.")
    checked_at = serializers.FloatField(allow_null=True, help_text="Unix time of the latest probe.")
    reason = serializers.CharField(allow_blank=True, help_text="Why the probe failed.")
    processes = serializers.IntegerField(help_text="Gateway processes with a fresh verdict.")
    down_in = serializers.IntegerField(help_text="How many of them find it down.")


# One member's configured share against its actual share (apps.gateway.loadbalancer.MemberShare). Built
# with inline_serializer: its field ``errors`` would shadow Serializer.errors as a class attribute.
MemberShareSerializer = inline_serializer(
    name="MemberShare",
    fields={
        "member": serializers.CharField(),
        "server": serializers.CharField(allow_null=True),
        "weight": serializers.IntegerField(),
        "configured_share": serializers.FloatField(),
        "actual_share": serializers.FloatField(allow_null=True),
        "requests": serializers.IntegerField(),
        "errors": serializers.IntegerField(),
        "drift": serializers.BooleanField(),
        "reason": serializers.CharField(allow_blank=True),
        "bench": BenchSerializer(allow_null=True),
        "probe": BackendProbeSerializer(),
        "affinity_requests": serializers.IntegerField(
            allow_null=True, help_text="Prefix affinity: requests routed to it by their prefix in the window."
        ),
        "cache_hit_share": serializers.FloatField(
            allow_null=True,
            help_text="Prefix affinity: the share of those that went to it as their prefix's home (the "
            "backend holding the prefix's cache); the rest were sent on past a load cap or an outage.",
        ),
        "max_concurrent": serializers.IntegerField(
            allow_null=True,
            help_text="Its runtime profile's max_concurrent: requests the gateway sends it at once (the rest "
            "wait in the admission queue); null: no limit.",
        ),
        "in_flight": serializers.IntegerField(
            allow_null=True,
            help_text="Requests in flight to it, summed over the gateway processes as of their last flush "
            "(at most a second or two old); null while Redis cannot be read.",
        ),
    },
)


class AdmissionQueueSerializer(serializers.Serializer):
    capability = serializers.CharField(help_text="A capability the cluster serves.")
    waiting = serializers.IntegerField(
        allow_null=True,
        help_text="Requests waiting at the gateway for a backend below its max_concurrent, summed over the "
        "web processes as of their last flush; null while Redis cannot be read.",
    )


class LoadBalancerReportSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    algorithm = serializers.CharField()
    effective_algorithm = serializers.CharField()
    mixed_routing = serializers.BooleanField()
    window_minutes = serializers.IntegerField()
    requests = serializers.IntegerField()
    steady = serializers.BooleanField()
    redis_ok = serializers.BooleanField()
    probe_every_s = serializers.IntegerField(help_text="How often each gateway process probes a backend.")
    members = serializers.ListField(child=MemberShareSerializer)
    cache_hit_share = serializers.FloatField(
        allow_null=True,
        help_text="Prefix affinity: the share of requests routed by prefix that reached the backend holding "
        "their prefix; null under other algorithms or before any.",
    )
    affinity_requests = serializers.IntegerField(allow_null=True)
    load_cap_pct = serializers.IntegerField(
        allow_null=True,
        help_text="Prefix affinity's load cap: the % of the mean load (by weight) a backend may carry.",
    )
    queue = serializers.ListField(
        child=AdmissionQueueSerializer(),
        help_text="The admission queue of each capability the cluster serves (the routing tiers' and the "
        "aliases following them): the same figure as modelforge_gateway_queue_depth.",
    )
    queue_max_waiting = serializers.IntegerField(
        help_text="MODELFORGE_GATEWAY_QUEUE_MAX_WAITING: past this many waiting per capability in one web "
        "process, 503 QUEUE_FULL."
    )
    queue_deadline_s = serializers.IntegerField(
        help_text="MODELFORGE_GATEWAY_QUEUE_DEADLINE_S: a request waits at most this long, then 503 "
        "QUEUE_TIMEOUT."
    )
