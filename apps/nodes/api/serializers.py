from __future__ import annotations

import re
from typing import Any, ClassVar

from django.core.validators import RegexValidator
from rest_framework import serializers

from apps.nodes.agent_url import AGENT_URL, message
from apps.nodes.choices import Accelerator, Liveness
from apps.nodes.models import GPU, EnrollmentToken, ListeningClock, Node, NodeEvent, events_of
from modelforge.validators import PrintableText

NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class AgentUrl(RegexValidator):
    """The agent's URL (apps.nodes.agent_url): its pattern is the whole rule, and the OpenAPI schema states
    it; a URL it refuses is told what is wrong with it."""

    regex = re.compile(AGENT_URL)

    def __call__(self, value: Any) -> None:
        refused = message(str(value))
        if refused is not None:
            raise serializers.ValidationError(refused)


class StrictSerializer(PrintableText):
    """Refuses fields it does not know: an agent can set only what it reports. Its text is printable
    (modelforge.validators)."""

    openapi_rules: ClassVar[dict[str, Any]] = {"additionalProperties": False}
    openapi_partial_rules: ClassVar[dict[str, Any]] = {"additionalProperties": False}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class EnrollRequestSerializer(StrictSerializer):
    token = serializers.CharField(max_length=128)
    name = serializers.RegexField(
        NODE_NAME,
        max_length=63,
        error_messages={
            "invalid": "Use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit."
        },
    )
    accelerator = serializers.ChoiceField(choices=Accelerator.choices)
    agent_version = serializers.CharField(max_length=32)
    # Not URLField: a container's host name (no dot) is a perfectly good address for the control plane.
    # Not trimmed: the pattern the schema states refuses a space anywhere, and so does the answer.
    agent_url = serializers.CharField(max_length=255, trim_whitespace=False, validators=[AgentUrl()])


class PingSerializer(serializers.Serializer):
    task_id = serializers.CharField(help_text="The Celery task that pings the node's agent.")


class EnrollResponseSerializer(serializers.Serializer):
    node_id = serializers.UUIDField()
    node_name = serializers.CharField()
    credential = serializers.CharField(help_text="Shown once; the control plane keeps only its digest.")
    heartbeat_interval_s = serializers.IntegerField()


class GPUSerializer(serializers.ModelSerializer):
    memory_external_bytes = serializers.IntegerField(read_only=True)
    memory_free_bytes = serializers.IntegerField(read_only=True)

    class Meta:
        model = GPU
        fields = [
            "index",
            "uuid",
            "name",
            "memory_total_bytes",
            "memory_used_bytes",
            "memory_managed_bytes",
            "memory_external_bytes",
            "memory_free_bytes",
            "utilization_percent",
            "temperature_c",
            "reported_at",
        ]


class NodeEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = NodeEvent
        # fleet_size: how many nodes a transition of many at once moved (one event for them all); null
        # for the node's own event.
        fields = ["kind", "from_liveness", "to_liveness", "at", "detail", "fleet_size"]


class NodeSerializer(serializers.ModelSerializer):
    """A node as operators see it. Only ``enabled`` is writable, and only through enable/disable."""

    gpus = GPUSerializer(many=True, read_only=True)
    # As it is now: ``stale`` for a node in the fleet's stale state (models.liveness_now).
    liveness = serializers.ChoiceField(choices=Liveness.choices, source="liveness_now", read_only=True)
    assignable = serializers.SerializerMethodField()
    cluster_secret_mismatch = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "accelerator",
            "enabled",
            "liveness",
            "assignable",
            "last_heartbeat_at",
            "enrolled_at",
            "agent_version",
            "agent_url",
            "agent_reached_at",
            "agent_error",
            "cluster_secret_mismatch",
            "secret_mismatch_at",
            "cpu_count",
            "load_1m",
            "memory_total_bytes",
            "memory_available_bytes",
            "shm_total_bytes",
            "shm_free_bytes",
            "models_present",
            "gpus",
        ]
        read_only_fields = fields

    def get_assignable(self, node: Node) -> bool:
        return node.is_assignable()

    def get_cluster_secret_mismatch(self, node: Node) -> bool:
        return node.secret_mismatch_at is not None


class NodeDetailSerializer(NodeSerializer):
    recent_events = serializers.SerializerMethodField()

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "recent_events"]
        read_only_fields = fields

    def get_recent_events(self, node: Node) -> list[dict[str, Any]]:
        return NodeEventSerializer(events_of(node)[:20], many=True).data  # type: ignore[return-value]


class EnrollmentTokenSerializer(PrintableText, serializers.ModelSerializer):
    state = serializers.CharField(read_only=True)
    ttl_seconds = serializers.IntegerField(
        write_only=True,
        required=False,
        min_value=60,
        max_value=30 * 86400,
        help_text="Lifetime in seconds (default MODELFORGE_ENROLLMENT_TOKEN_TTL).",
    )
    node_name = serializers.CharField(source="node.name", read_only=True, default=None, allow_null=True)

    class Meta:
        model = EnrollmentToken
        fields = [
            "id",
            "display_prefix",
            "note",
            "created_at",
            "expires_at",
            "used_at",
            "revoked_at",
            "state",
            "node",
            "node_name",
            "ttl_seconds",
        ]
        # A client writes the note and the lifetime; the rest is the token's record.
        read_only_fields = [f for f in fields if f not in {"note", "ttl_seconds"}]


class MintedTokenSerializer(EnrollmentTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; only its digest is stored.")

    class Meta(EnrollmentTokenSerializer.Meta):
        fields = [*EnrollmentTokenSerializer.Meta.fields, "token"]


class ListeningClockSerializer(serializers.ModelSerializer):
    """Since when the control plane has been able to hear its nodes, and the mass-loss hold."""

    class Meta:
        model = ListeningClock
        fields = [
            "listening_since",
            "listening_reason",
            "web_seen_at",
            "swept_at",
            "hold_since",
            "hold_nodes",
            "confirmed_at",
            "confirmed_by",
            "fleet_stale_before",
            "fleet_offline_before",
        ]
        read_only_fields = fields
