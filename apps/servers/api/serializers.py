from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.artifacts.models import Artifact
from apps.servers.models import ModelServer, ServerEvent

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class PlaceRequestSerializer(serializers.Serializer):
    name = serializers.RegexField(NAME, max_length=63)
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

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("model") and not attrs.get("artifact"):
            raise serializers.ValidationError({"model": ["Give a model name or an artifact."]})
        attrs.setdefault("model", "")
        return attrs

    def validate_name(self, value: str) -> str:
        if ModelServer.objects.filter(name=value).exists():
            raise serializers.ValidationError("A model server with this name exists.")
        return value


class ServerEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServerEvent
        fields = ["from_state", "to_state", "at", "detail"]


class ModelServerSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True, default=None)
    gpu_indexes = serializers.SerializerMethodField()

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
            "created_at",
            "running_at",
            "stopped_at",
        ]
        read_only_fields = fields

    def get_gpu_indexes(self, server: ModelServer) -> list[int]:
        return sorted(r.gpu.index for r in server.reservations.all() if r.gpu is not None)


class ModelServerDetailSerializer(ModelServerSerializer):
    placement_explanation = serializers.JSONField(read_only=True)
    events = serializers.SerializerMethodField()

    class Meta(ModelServerSerializer.Meta):
        fields = [*ModelServerSerializer.Meta.fields, "placement_explanation", "events"]
        read_only_fields = fields

    def get_events(self, server: ModelServer) -> list[dict[str, Any]]:
        return ServerEventSerializer(server.events.all()[:50], many=True).data  # type: ignore[return-value]
