from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django.db import transaction
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.validators import UniqueValidator

from apps.artifacts.models import Artifact
from apps.nodes.api.serializers import StrictSerializer
from apps.nodes.engine_signals import engine_view
from apps.servers import codes, recovery
from apps.servers.choices import RestartPolicy
from apps.servers.models import ModelServer, ServerEvent
from apps.servers.scheduler import Request as PlaceRequest
from apps.servers.scheduler import place
from apps.servers.usage import used_by
from modelforge.errors import codes as errors
from modelforge.validators import PrintableText

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class PlaceRequestSerializer(PrintableText):
    # What the scheduler refuses for what is configured or stored (modelforge.autoschema): a profile that
    # is not configured, a node pinned by a name no node has.
    openapi_state_refusals: ClassVar[dict[str, int]] = {
        codes.UNKNOWN_RUNTIME_PROFILE: 400,
        errors.REFERENCE_NOT_FOUND: 400,
    }
    # A model name or an artifact (validate() below).
    openapi_rules: ClassVar[dict[str, Any]] = {
        "anyOf": [
            {"required": ["model"]},
            {"required": ["artifact"], "properties": {"artifact": {"type": "integer"}}},
        ]
    }

    name = serializers.RegexField(
        NAME,
        max_length=63,
        validators=[
            UniqueValidator(ModelServer.objects.all(), message="A model server with this name exists.")
        ],
    )
    profile = serializers.CharField(max_length=63)
    model = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$", max_length=255, required=False)
    gpus = serializers.IntegerField(min_value=0, max_value=64, default=0)
    weights_bytes = serializers.IntegerField(min_value=1, max_value=2**50, required=False)
    encrypted = serializers.BooleanField(default=False)
    node = serializers.CharField(max_length=63, required=False, help_text="Pin to this node (by name).")
    artifact = serializers.PrimaryKeyRelatedField(
        queryset=Artifact.objects.all(),
        required=False,
        allow_null=True,
        help_text="Serve this artifact: model name, size and encryption come from it.",
    )
    restart_policy = serializers.ChoiceField(
        choices=RestartPolicy.choices,
        default=RestartPolicy.ON_FAILURE,
        help_text="on-failure: restarted after a restartable failure, with back-off; never: left failed.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("model") and not attrs.get("artifact"):
            raise serializers.ValidationError({"model": ["Give a model name or an artifact."]})
        attrs.setdefault("model", "")
        return attrs

    def place(self) -> ModelServer:
        """Place the server from the validated data (or raise the scheduler's refusal). The scheduler's
        request has no restart policy: it is set in the same transaction, so the start task (sent on
        commit) and the recovery sweep never see the server without it."""
        data = dict(self.validated_data)
        policy = data.pop("restart_policy", RestartPolicy.ON_FAILURE)
        with transaction.atomic():
            server = place(PlaceRequest(**data))
            server.set_restart_policy(policy)
        return server


class ServerChangeSerializer(StrictSerializer):
    """What ``PATCH /servers/{id}`` may change: only the restart policy, which it must name."""

    openapi_partial_rules: ClassVar[dict[str, Any]] = {
        **StrictSerializer.openapi_partial_rules,
        "required": ["restart_policy"],
    }

    restart_policy = serializers.ChoiceField(choices=RestartPolicy.choices)


class ServerEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServerEvent
        fields = ["from_state", "to_state", "at", "detail"]


class ModelServerSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True, default=None, allow_null=True)
    gpu_indexes = serializers.SerializerMethodField()
    next_restart_at = serializers.SerializerMethodField(
        help_text="When the restart policy tries again; null when it will not."
    )

    class Meta:
        model = ModelServer
        fields = [
            "id",
            "name",
            "profile",
            "model",
            "artifact",
            "weights_bytes",
            "gpus_wanted",
            "encrypted",
            "state",
            "node",
            "node_name",
            "gpu_indexes",
            "memory_per_unit_bytes",
            "memory_rule",
            "port",
            "pid",
            "failure_code",
            "failure_message",
            "restart_policy",
            "restart_attempts",
            "next_restart_at",
            "created_at",
            "running_at",
            "stopped_at",
        ]
        read_only_fields = fields

    def get_gpu_indexes(self, server: ModelServer) -> list[int]:
        return sorted(r.gpu.index for r in server.reservations.all() if r.gpu is not None)

    def get_next_restart_at(self, server: ModelServer) -> datetime | None:
        return recovery.next_restart_at(server)


class ClusterUseSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    member = serializers.CharField()


class CapabilityUseSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    tier = serializers.IntegerField()
    via = serializers.ChoiceField(
        choices=["server", "cluster"], help_text="Bound as a standalone server, or through its cluster."
    )
    cluster = serializers.CharField(allow_null=True)


class UsedBySerializer(serializers.Serializer):
    clusters = ClusterUseSerializer(many=True)
    capabilities = CapabilityUseSerializer(many=True)


class EngineSignalsSerializer(serializers.Serializer):
    state = serializers.ChoiceField(
        choices=["reported", "stale", "not_reported", "unknown"],
        help_text="reported: within MODELFORGE_ENGINE_SIGNALS_MAX_AGE_S; stale: older; not_reported: "
        "the engine publishes no metrics the agent reads (or the node never said); unknown: Redis did "
        "not answer.",
    )
    running = serializers.IntegerField(allow_null=True, help_text="Requests the engine is working on.")
    waiting = serializers.IntegerField(allow_null=True, help_text="Requests queued inside the engine.")
    kv_cache_used = serializers.FloatField(
        allow_null=True, help_text="Share of the KV cache in use, 0..1; null when the engine does not say."
    )
    reported_at = serializers.FloatField(
        allow_null=True, help_text="Unix seconds: when the heartbeat carrying them arrived."
    )


class ModelServerDetailSerializer(ModelServerSerializer):
    placement_explanation = serializers.JSONField(read_only=True)
    events = serializers.SerializerMethodField()
    used_by = serializers.SerializerMethodField()
    engine = serializers.SerializerMethodField(
        help_text="The engine's own load as its node last reported it with a heartbeat."
    )

    class Meta(ModelServerSerializer.Meta):
        fields = [*ModelServerSerializer.Meta.fields, "placement_explanation", "used_by", "engine", "events"]
        read_only_fields = fields

    @extend_schema_field(EngineSignalsSerializer)
    def get_engine(self, server: ModelServer) -> dict[str, Any]:
        node = str(server.node_id) if server.node_id else None
        return engine_view(str(server.pk), node).as_payload()

    @extend_schema_field(UsedBySerializer)
    def get_used_by(self, server: ModelServer) -> dict[str, Any]:
        return UsedBySerializer(used_by(server)).data

    def get_events(self, server: ModelServer) -> list[dict[str, Any]]:
        return ServerEventSerializer(server.events.all()[:50], many=True).data  # type: ignore[return-value]
