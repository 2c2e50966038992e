from __future__ import annotations

from rest_framework import serializers

from apps.backups.models import Backup, BackupEvent, Restore, RestorePhase


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


class RestoreRequestSerializer(serializers.Serializer):
    backup = serializers.PrimaryKeyRelatedField(queryset=Backup.objects.all())
    reason = serializers.CharField(max_length=2000)
    point_in_time = serializers.DateTimeField(
        required=False, help_text="Not supported in v1: a request naming one is refused with NOT_SUPPORTED."
    )


class ReviewSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)
