from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from rest_framework import serializers

from apps.alerts.choices import ChannelKind
from apps.alerts.models import Alert, Notification, NotificationChannel


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


class NotificationChannelSerializer(serializers.ModelSerializer):
    """A webhook takes an http(s) URL; e-mail takes addresses separated by commas. The secret is
    write-only: it signs webhook bodies and is never shown again."""

    secret = serializers.CharField(max_length=200, required=False, allow_blank=True, write_only=True)
    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = NotificationChannel
        fields = [
            "id",
            "name",
            "kind",
            "target",
            "secret",
            "has_secret",
            "min_severity",
            "enabled",
            "created_at",
            "created_by",
            "last_success_at",
            "last_failure_at",
            "last_error",
        ]
        read_only_fields = ["created_at", "created_by", "last_success_at", "last_failure_at", "last_error"]

    def get_has_secret(self, channel: NotificationChannel) -> bool:
        return bool(channel.secret)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        target = str(attrs.get("target", getattr(self.instance, "target", ""))).strip()
        if kind == ChannelKind.WEBHOOK:
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise serializers.ValidationError({"target": ["A webhook needs an http:// or https:// URL."]})
        elif kind == ChannelKind.EMAIL:
            addresses = [a.strip() for a in target.split(",") if a.strip()]
            if not addresses:
                raise serializers.ValidationError({"target": ["Give at least one e-mail address."]})
            for address in addresses:
                try:
                    validate_email(address)
                except DjangoValidationError:
                    raise serializers.ValidationError(
                        {"target": [f"{address!r} is not an e-mail address."]}
                    ) from None
            if attrs.get("secret"):
                raise serializers.ValidationError({"secret": ["Only webhooks are signed."]})
        if "target" in attrs:
            attrs["target"] = target
        return attrs


class NotificationSerializer(serializers.ModelSerializer):
    channel_name = serializers.CharField(source="channel.name", read_only=True)
    code = serializers.CharField(source="alert.code", read_only=True)
    subject_name = serializers.CharField(source="alert.subject_name", read_only=True)

    class Meta:
        model = Notification
        fields = [
            "id",
            "channel",
            "channel_name",
            "alert",
            "code",
            "subject_name",
            "event",
            "state",
            "attempts",
            "next_attempt_at",
            "last_error",
            "created_at",
            "sent_at",
        ]
        read_only_fields = fields
