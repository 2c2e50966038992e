from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.clusters.models import CAPABILITY, Capability
from apps.embedding_migrations.adapters.base import NAME
from apps.embedding_migrations.choices import Pooling
from apps.embedding_migrations.models import ConsumerAlias, Cutover, CutoverEvent, EmbeddingSpace, VectorStore
from modelforge.validators import PrintableText


class EmbeddingSpaceSerializer(serializers.ModelSerializer):
    capability: serializers.SlugRelatedField[Capability] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    key = serializers.CharField(read_only=True)
    description = serializers.CharField(source="describe", read_only=True)

    class Meta:
        model = EmbeddingSpace
        fields = [
            "id",
            "capability",
            "key",
            "description",
            "model",
            "revision",
            "dimension",
            "normalized",
            "pooling",
            "recorded_at",
            "recorded_by",
        ]
        read_only_fields = fields


class DeclareSpaceSerializer(PrintableText):
    capability = serializers.SlugRelatedField(
        slug_field="name", queryset=Capability.objects.filter(follows__isnull=True)
    )
    model = serializers.CharField(max_length=255)
    revision = serializers.CharField(max_length=100, allow_blank=True, default="")
    dimension = serializers.IntegerField(min_value=1, max_value=65536)
    normalized = serializers.BooleanField()
    pooling = serializers.ChoiceField(choices=Pooling.choices, default=Pooling.UNKNOWN)


class MeasureSpaceSerializer(serializers.Serializer):
    capability = serializers.SlugRelatedField(
        slug_field="name", queryset=Capability.objects.filter(follows__isnull=True)
    )
    pooling = serializers.ChoiceField(choices=Pooling.choices, default=Pooling.UNKNOWN)


class VectorStoreSerializer(PrintableText, serializers.ModelSerializer):
    dsn = serializers.CharField(max_length=500, write_only=True, help_text="Never shown back.")
    kind = serializers.ChoiceField(choices=["pgvector"])

    class Meta:
        model = VectorStore
        fields = ["id", "name", "kind", "dsn", "created_at"]
        read_only_fields = ["id", "created_at"]


class CreateIndexSerializer(serializers.Serializer):
    name = serializers.RegexField(NAME.pattern, max_length=63)
    capability = serializers.SlugRelatedField(
        slug_field="name", queryset=Capability.objects.filter(follows__isnull=True)
    )


class ConsumerAliasSerializer(PrintableText, serializers.ModelSerializer):
    store = serializers.PrimaryKeyRelatedField(queryset=VectorStore.objects.all())
    name = serializers.RegexField(NAME.pattern, max_length=63)
    index = serializers.RegexField(NAME.pattern, max_length=63)
    capability = serializers.SlugRelatedField(
        slug_field="name", queryset=Capability.objects.filter(follows__isnull=True)
    )
    query_capability = serializers.RegexField(
        CAPABILITY.pattern, source="query_capability.name", help_text="The name consumers embed queries with."
    )

    class Meta:
        model = ConsumerAlias
        fields = ["id", "store", "name", "index", "capability", "query_capability", "created_at"]
        read_only_fields = ["id", "created_at"]


class CutoverEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = CutoverEvent
        fields = ["at", "from_stage", "to_stage", "actor", "reason", "detail"]
        read_only_fields = fields


class CutoverSerializer(serializers.ModelSerializer):
    source_capability: serializers.SlugRelatedField[Capability] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    target_capability: serializers.SlugRelatedField[Capability] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    alias_name = serializers.CharField(source="alias.__str__", read_only=True)
    interrupted = serializers.BooleanField(read_only=True)
    progress = serializers.SerializerMethodField()
    events = CutoverEventSerializer(many=True, read_only=True)

    class Meta:
        model = Cutover
        fields = [
            "id",
            "alias",
            "alias_name",
            "source_capability",
            "target_capability",
            "source_index",
            "target_index",
            "source_space",
            "target_space",
            "same_space",
            "stage",
            "stage_since",
            "interrupted",
            "interrupted_at",
            "heartbeat_at",
            "failure_code",
            "failure_message",
            "failed_in",
            "batch_size",
            "progress",
            "verification",
            "created_by",
            "created_at",
            "completed_at",
            "events",
        ]
        read_only_fields = fields

    def get_progress(self, cutover: Cutover) -> dict[str, Any]:
        return {
            "documents_done": cutover.docs_done,
            "documents_total": cutover.docs_total,
            "percent": round(cutover.percent, 1),
            "documents_per_second": round(cutover.rate, 1) if cutover.rate else None,
            "seconds_left": round(cutover.seconds_left, 1) if cutover.seconds_left is not None else None,
        }


class PlanCutoverSerializer(serializers.Serializer):
    alias = serializers.PrimaryKeyRelatedField(queryset=ConsumerAlias.objects.all())
    target_capability = serializers.SlugRelatedField(
        slug_field="name", queryset=Capability.objects.filter(follows__isnull=True)
    )
    batch_size = serializers.IntegerField(min_value=1, max_value=2048, default=128)


class ActionSerializer(PrintableText):
    free_text_fields = ("reason",)
    reason = serializers.CharField(max_length=2000)


class OptionalReasonSerializer(PrintableText):
    free_text_fields = ("reason",)
    reason = serializers.CharField(max_length=2000, required=False, default="")
