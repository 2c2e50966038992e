from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.artifacts import codes, local_roots
from apps.artifacts.models import Artifact, ArtifactEvent, Replica, SourceKind
from modelforge.errors import ApiError
from modelforge.validators import PrintableText


class ArtifactEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ArtifactEvent
        fields = ["from_state", "to_state", "at", "by", "detail"]


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "string", "minLength": 64, "maxLength": 64},
        "description": "{relative path: sha256 as 64 hex digits}",
    }
)
class Sha256MapField(serializers.JSONField):
    """Expected digests by relative path; ``validate_expected_sha256`` below checks them."""


class ArtifactSerializer(PrintableText, serializers.ModelSerializer):
    # validate(): a local source is read only under MODELFORGE_ARTIFACT_LOCAL_ROOTS, configuration no
    # schema can state (modelforge.autoschema).
    openapi_state_refusals: ClassVar[dict[str, int]] = {codes.LOCAL_SOURCE_NOT_ALLOWED: 400}
    events = ArtifactEventSerializer(many=True, read_only=True)
    expected_sha256 = Sha256MapField(required=False)

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

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A local path is judged when it is registered (and again when the worker reads it): the control
        # plane serves what it acquires to every node, so it reads only under the configured roots.
        if attrs.get("source_kind") == SourceKind.LOCAL:
            try:
                local_roots.admit(attrs.get("locator", ""))
            except local_roots.LocalSourceRefused as exc:
                raise ApiError(codes.LOCAL_SOURCE_NOT_ALLOWED, str(exc), 400) from exc
        return attrs


class ReleaseSerializer(PrintableText):
    free_text_fields = ("reason",)
    reason = serializers.CharField(max_length=1000)


class AmendSerializer(PrintableText):
    free_text_fields = ("reason",)
    # Something to amend (acquisition.amend): the licence, the expected digests, or both.
    openapi_rules: ClassVar[dict[str, Any]] = {
        "anyOf": [{"required": ["licence"]}, {"required": ["expected_sha256"]}]
    }
    reason = serializers.CharField(max_length=1000)
    licence = serializers.CharField(max_length=100, required=False, allow_blank=True)
    expected_sha256 = Sha256MapField(required=False)

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
        # No unique-together check: asking again for an artifact on the same node is the way to retry
        # it (replication.request_replica finds the row), not a conflict.
        validators: list[Any] = []
