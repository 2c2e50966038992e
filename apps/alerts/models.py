from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, models
from django.utils import timezone

from apps.alerts.choices import ChannelKind, NotificationEvent, NotificationState, Severity


def dedup_key_for(code: str, subject_type: str, subject_id: str) -> str:
    return f"{code}:{subject_type}:{subject_id}"


@dataclass(frozen=True, init=False)
class AroundName:
    """One message for many subjects: literal pieces with each subject's name put between them, so
    ``AroundName("Node ", " is offline.")`` is ``Node gpu-7 is offline.`` for ``gpu-7``.

    Alert text is data, never a template: names and the rest come from operators and remote systems
    (a channel's name, a webhook's reply), and a brace in them once crashed whatever raised the alert
    (issue 47). Nothing here is parsed; the pieces are joined as they are, here or in SQL."""

    pieces: tuple[str, ...]

    def __init__(self, *pieces: str) -> None:
        object.__setattr__(self, "pieces", tuple(pieces))

    def for_name(self, name: str) -> str:
        return name.join(self.pieces)


class AlertQuerySet(models.QuerySet["Alert"]):
    def open(self) -> AlertQuerySet:
        return self.filter(cleared_at__isnull=True)


class AlertManager(models.Manager["Alert"]):
    def get_queryset(self) -> AlertQuerySet:
        return AlertQuerySet(self.model, using=self._db)

    def open(self) -> AlertQuerySet:
        return self.get_queryset().open()

    def raise_many(
        self,
        code: str,
        severity: str,
        subject_type: str,
        subjects: Sequence[tuple[str, str]],
        message: str | AroundName,
        at: datetime | None = None,
    ) -> int:
        """Raise ``code`` for each ``(subject_id, subject_name)`` in one statement.

        An alert already open for the same de-duplication key is not duplicated: it counts one more
        occurrence. ``message`` is the text every subject gets, or an ``AroundName`` whose pieces are put
        around each subject's name; either is stored as written, never formatted. Returns how many new
        alerts were opened.

        The subjects travel as ONE JSON text and the keys and messages are built in the statement: a whole
        fleet's worth (the liveness sweep after an outage) costs a few milliseconds to send, where arrays
        of one value per subject cost microseconds per value in the driver and one parsed constant each in
        PostgreSQL (bench/heartbeats).
        """
        if not subjects:
            return 0
        at = at or timezone.now()
        # array_to_string(pieces, name) in SQL is name.join(pieces): a plain text is one piece.
        parts = list(message.pieces) if isinstance(message, AroundName) else [message]
        rows = [[str(subject_id), name] for subject_id, name in subjects]
        table = self.model._meta.db_table
        # ON CONFLICT on the partial unique index (one open alert per key) makes raising idempotent
        # and race-safe; xmax = 0 tells an inserted row from an updated one.
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                WITH s AS (
                    SELECT e ->> 0 AS id, e ->> 1 AS name
                    FROM json_array_elements(%(subjects)s::json) AS e
                ), raised AS (
                    INSERT INTO {table} (code, severity, subject_type, subject_id, subject_name, dedup_key,
                                         message, raised_at, last_raised_at, occurrences)
                    SELECT %(code)s, %(severity)s, %(subject_type)s, s.id, s.name, %(key_prefix)s || s.id,
                           array_to_string(%(parts)s::text[], s.name), %(at)s, %(at)s, 1
                    FROM s
                    ON CONFLICT (dedup_key) WHERE cleared_at IS NULL
                    DO UPDATE SET last_raised_at = EXCLUDED.last_raised_at,
                                  occurrences = {table}.occurrences + 1,
                                  message = EXCLUDED.message
                    RETURNING (xmax = 0) AS inserted
                )
                SELECT count(*) FILTER (WHERE inserted) FROM raised
                """,  # noqa: S608 -- the table name is ours; every value is a parameter
                {
                    "subjects": json.dumps(rows),
                    "code": code,
                    "severity": severity,
                    "subject_type": subject_type,
                    "key_prefix": dedup_key_for(code, subject_type, ""),
                    "parts": parts,
                    "at": at,
                },
            )
            (opened,) = cursor.fetchone()
            return int(opened)

    def raise_alert(
        self,
        code: str,
        severity: str,
        subject_type: str,
        subject_id: str,
        subject_name: str,
        message: str,
        at: datetime | None = None,
    ) -> bool:
        """Raise one alert with ``message`` exactly as written; ``True`` if a new one was opened, ``False``
        if it was already open."""
        return self.raise_many(code, severity, subject_type, [(subject_id, subject_name)], message, at) == 1

    def clear(self, keys: Iterable[str], at: datetime | None = None) -> int:
        """Clear the open alerts with these de-duplication keys; returns how many were cleared."""
        keys = list(keys)
        if not keys:
            return 0
        return self.open().filter(dedup_key__in=keys).update(cleared_at=at or timezone.now())

    def clear_for(
        self, codes: Iterable[str], subject_type: str, subject_id: str, at: datetime | None = None
    ) -> int:
        return self.clear((dedup_key_for(code, subject_type, str(subject_id)) for code in codes), at)


class Alert(models.Model):
    """A condition that needs an operator's attention, raised once and cleared when it no longer holds."""

    code = models.CharField(max_length=64)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    subject_type = models.CharField(max_length=32)
    subject_id = models.CharField(max_length=64)
    subject_name = models.CharField(max_length=255)
    dedup_key = models.CharField(max_length=255)
    message = models.TextField()
    raised_at = models.DateTimeField(default=timezone.now)
    last_raised_at = models.DateTimeField(default=timezone.now)
    cleared_at = models.DateTimeField(null=True, blank=True)
    occurrences = models.PositiveIntegerField(default=1)

    objects = AlertManager()

    class Meta:
        ordering = ["-raised_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["dedup_key"],
                condition=models.Q(cleared_at__isnull=True),
                name="alerts_one_open_alert_per_key",
            ),
        ]
        # Few indexes on purpose: a mass outage raises thousands of alerts in one statement, and every
        # index is written per row. Lists are small and ordered by time; subjects are looked up by key.
        indexes = [
            models.Index(fields=["subject_type", "subject_id"], name="alerts_subject_idx"),
            models.Index(fields=["-raised_at"], name="alerts_raised_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.code} on {self.subject_type} {self.subject_name}"

    @property
    def is_open(self) -> bool:
        return self.cleared_at is None


class NotificationChannel(models.Model):
    """Where alert events are sent: a webhook (JSON POST, optionally signed) or e-mail addresses.

    A channel receives the events of alerts at or above ``min_severity`` raised or cleared after it was
    created (a new channel does not replay history)."""

    name = models.CharField(max_length=63, unique=True)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    target = models.CharField(
        max_length=1000, help_text="The webhook's http(s) URL, or e-mail addresses separated by commas."
    )
    secret = models.CharField(
        max_length=200,
        blank=True,
        help_text="Webhooks: signs each body (X-ModelForge-Signature: sha256=HMAC of the body).",
    )
    min_severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Notification(models.Model):
    """One event (raised or cleared) of one alert for one channel: the outbox the worker delivers."""

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="notifications")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=16, choices=NotificationEvent.choices)
    state = models.CharField(
        max_length=16, choices=NotificationState.choices, default=NotificationState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "alert", "event"], name="alerts_one_notification_per_event"
            )
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="alerts_notify_due_idx")]

    def __str__(self) -> str:
        return f"{self.alert.code} {self.event} via {self.channel.name} ({self.state})"
