from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from rest_framework import serializers

from apps.alerts.choices import ChannelKind
from apps.alerts.models import Alert, Notification, NotificationChannel
from modelforge.errors import codes
from modelforge.validators import PrintableText


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


# What validate() below admits, for the OpenAPI schema (a PATCH is judged with the stored kind, which a
# schema cannot see: stated for whole bodies only). The kinds are patterns, not enums: drf-spectacular's
# enum post-processing would replace an enum here with the kind's whole choice set. The e-mail pattern
# is the common shape of an address, and the webhook's host is ASCII and its port a number (httpx, which
# sends it, refuses a host that is not a valid IDNA name); what validate() admits is a little wider.
_WEBHOOK = (
    r"^[hH][tT][tT][pP][sS]?://([^/?#@\[\]]*@)?[A-Za-z0-9._~%!$&'()*+,;=-]+"
    r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})?)?([/?#].*)?$"
)
_ADDRESS = (
    r"[A-Za-z0-9_%+-]{1,64}(\.[A-Za-z0-9_%+-]{1,64}){0,3}"
    r"@([A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?\.){1,4}[A-Za-z]{2,24}"
)


class NotificationChannelSerializer(PrintableText, serializers.ModelSerializer):
    """A webhook takes an http(s) URL; e-mail takes addresses separated by commas. The secret is
    write-only: it signs webhook bodies and is never shown again."""

    openapi_rules: ClassVar[dict[str, Any]] = {
        "oneOf": [
            {
                "properties": {
                    "kind": {"type": "string", "pattern": "^webhook$"},
                    "target": {"type": "string", "pattern": _WEBHOOK},
                }
            },
            {
                "properties": {
                    "kind": {"type": "string", "pattern": "^email$"},
                    "target": {"type": "string", "pattern": rf"^{_ADDRESS}( *, *{_ADDRESS})*$"},
                    "secret": {"type": "string", "maxLength": 0},
                }
            },
        ]
    }
    # A PATCH that names the kind is held to it; one that does not is judged by the stored kind.
    openapi_partial_rules: ClassVar[dict[str, Any]] = {
        "anyOf": [{"required": ["kind"], **branch} for branch in openapi_rules["oneOf"]]
        + [{"not": {"required": ["kind"]}}]
    }

    # A PATCH's kind, target or secret alone is judged with the stored others (validate()).
    openapi_partial_state_refusals: ClassVar[dict[str, int]] = {codes.CONFLICTS_WITH_STORED: 409}

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
        # Judged with a stored value (a PATCH of the kind or the target alone): CONFLICTS_WITH_STORED, a
        # refusal for what is stored that the schema documents; the two sent together are the body's shape.
        stored = self.instance is not None and not {"kind", "target"} <= attrs.keys()
        refused = codes.CONFLICTS_WITH_STORED if stored else "invalid"
        if kind == ChannelKind.WEBHOOK:
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise serializers.ValidationError(
                    {"target": ["A webhook needs an http:// or https:// URL."]}, code=refused
                )
            try:
                httpx.URL(
                    target
                )  # what delivery sends to: httpx refuses a host that is not a valid IDNA name
            except httpx.InvalidURL as exc:
                raise serializers.ValidationError(
                    {"target": [f"Not a URL a webhook can be sent to: {exc}."]}, code=refused
                ) from None
        elif kind == ChannelKind.EMAIL:
            addresses = [a.strip() for a in target.split(",") if a.strip()]
            if not addresses:
                raise serializers.ValidationError(
                    {"target": ["Give at least one e-mail address."]}, code=refused
                )
            for address in addresses:
                try:
                    validate_email(address)
                except DjangoValidationError:
                    raise serializers.ValidationError(
                        {"target": [f"{address!r} is not an e-mail address."]}, code=refused
                    ) from None
            if attrs.get("secret"):
                stored_kind = self.instance is not None and "kind" not in attrs
                raise serializers.ValidationError(
                    {"secret": ["Only webhooks are signed."]},
                    code=codes.CONFLICTS_WITH_STORED if stored_kind else "invalid",
                )
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
