from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.artifacts.models import Artifact, ArtifactEvent, Replica


class ArtifactEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ArtifactEvent
        fields = ["from_state", "to_state", "at", "by", "detail"]


class ArtifactSerializer(serializers.ModelSerializer):
    events = ArtifactEventSerializer(many=True, read_only=True)

    class Meta:
        model = Artifact
        fields = [
            "id",
            "name",
            "source_kind",
            "locator",
            "revision",
            "expected_sha256",
            "licence",
            "encrypted",
            "state",
            "format",
            "files",
            "size_bytes",
            "progress_bytes",
            "checks",
            "quarantine_rule",
            "failure_code",
            "failure_message",
            "created_at",
            "acquired_at",
            "events",
        ]
        # Only the upstream identity is written by a client; everything else the platform records.
        read_only_fields = [
            f
            for f in fields
            if f
            not in {"name", "source_kind", "locator", "revision", "expected_sha256", "licence", "encrypted"}
        ]

    def validate_expected_sha256(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in value.items()
        ):
            raise serializers.ValidationError("Give {relative path: 64-hex sha256}.")
        return value


class ReleaseSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=1000)


class AmendSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=1000)
    licence = serializers.CharField(max_length=100, required=False, allow_blank=True)
    expected_sha256 = serializers.JSONField(required=False)

    def validate_expected_sha256(self, value: Any) -> dict[str, str]:
        return ArtifactSerializer().validate_expected_sha256(value)


class ReplicaSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    artifact_name = serializers.CharField(source="artifact.name", read_only=True)

    class Meta:
        model = Replica
        fields = [
            "id",
            "artifact",
            "artifact_name",
            "node",
            "node_name",
            "name",
            "state",
            "done_bytes",
            "total_bytes",
            "copy_seconds",
            "reason",
            "requested_by",
            "requested_at",
            "updated_at",
        ]
        read_only_fields = [
            "name",
            "state",
            "done_bytes",
            "total_bytes",
            "copy_seconds",
            "reason",
            "requested_by",
            "requested_at",
            "updated_at",
        ]
