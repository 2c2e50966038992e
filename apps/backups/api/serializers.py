from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.backups.models import Backup, BackupEvent, Restore, RestorePhase, RestorePhaseName, ReviewDecision
from modelforge.validators import PrintableText


class BackupEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = BackupEvent
        fields = ["from_state", "to_state", "at", "detail"]


class BackupSerializer(serializers.ModelSerializer):
    events = BackupEventSerializer(many=True, read_only=True)
    restore_eligible = serializers.BooleanField(read_only=True)

    class Meta:
        model = Backup
        fields = [
            "id",
            "state",
            "restore_eligible",
            "reason_code",
            "reason_message",
            "trigger",
            "requested_by",
            "phase",
            "directory",
            "files",
            "size_bytes",
            "database_name",
            "server_version",
            "schema_revision",
            "modelforge_version",
            "row_counts",
            "requested_at",
            "started_at",
            "finished_at",
            "consistent_as_of",
            "verified_at",
            "verification",
            "expired_at",
            "events",
        ]
        read_only_fields = fields


class BackupSummarySerializer(serializers.Serializer):
    newest_verified = BackupSerializer(allow_null=True)
    rpo_exposure_seconds = serializers.FloatField(allow_null=True)
    stale_after_seconds = serializers.IntegerField()
    stale = serializers.BooleanField()
    backup_root = serializers.CharField()


class RestorePhaseSerializer(serializers.ModelSerializer):
    class Meta:
        model = RestorePhase
        fields = ["name", "started_at", "finished_at", "outcome", "detail"]


class RestoreSerializer(serializers.ModelSerializer):
    phases = RestorePhaseSerializer(many=True, read_only=True)
    # Blank until the restore starts / is reviewed: stated, so that the schema admits the empty string.
    phase = serializers.ChoiceField(choices=RestorePhaseName.choices, allow_blank=True, read_only=True)
    review_decision = serializers.ChoiceField(
        choices=ReviewDecision.choices, allow_blank=True, read_only=True
    )

    class Meta:
        model = Restore
        fields = [
            "id",
            "backup",
            "state",
            "phase",
            "requested_by",
            "reason",
            "requested_at",
            "started_at",
            "finished_at",
            "target_database",
            "previous_database",
            "switched_over",
            "consistent_as_of",
            "rpo_seconds",
            "failure_code",
            "failure_message",
            "needs_review",
            "review_decision",
            "reviewed_by",
            "reviewed_at",
            "review_note",
            "phases",
        ]
        read_only_fields = fields


# "not {}": no value is valid, so a client that follows the schema leaves it out (null is ignored too).
@extend_schema_field({"not": {}})
class NotSupportedField(serializers.DateTimeField):
    """A field the API names only to refuse."""


class RestoreRequestSerializer(PrintableText):
    free_text_fields = ("reason",)
    backup = serializers.PrimaryKeyRelatedField(queryset=Backup.objects.all())
    reason = serializers.CharField(max_length=2000)
    point_in_time = NotSupportedField(
        required=False,
        allow_null=True,
        help_text="Not supported in v1: a request naming one is refused with NOT_SUPPORTED; null is ignored.",
    )


class ReviewSerializer(PrintableText):
    free_text_fields = ("reason",)
    reason = serializers.CharField(max_length=2000)
