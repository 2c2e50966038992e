from rest_framework import serializers

from apps.alerts.models import Alert


class AlertSerializer(serializers.ModelSerializer):
    is_open = serializers.BooleanField(read_only=True)

    class Meta:
        model = Alert
        fields = [
            "id",
            "code",
            "severity",
            "subject_type",
            "subject_id",
            "subject_name",
            "message",
            "raised_at",
            "last_raised_at",
            "cleared_at",
            "occurrences",
            "is_open",
        ]
        read_only_fields = fields
