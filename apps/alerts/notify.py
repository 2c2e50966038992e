"""Alert notifications: an outbox of events per channel, delivered by the worker in batches.

Alerts are raised and cleared in bulk statements (a mass outage opens thousands in one), so nothing is
sent from there. Every ``MODELFORGE_NOTIFY_INTERVAL`` seconds the ``alerts.notify`` task records, per
enabled channel, the events not yet recorded (``enqueue``, one statement per channel) and delivers what
is due (``deliver``): up to ``BATCH`` events in one webhook POST or one e-mail, so an outage is a few
messages, not thousands. A failed delivery is retried with a growing delay; after
``MODELFORGE_NOTIFY_MAX_ATTEMPTS`` the events are ``failed`` and the channel carries a
``NOTIFICATION_FAILED`` alert, cleared by its next successful delivery.

Each channel is delivered on its own (``deliver``): one that fails, throws or never answers costs the
others nothing. Every pass the task completes is stamped on the installation; the web processes raise
``NOTIFY_STALLED`` when passes stop completing (apps/alerts/outages.py), since an alert about this task
cannot be delivered by it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import smtplib
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMessage
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.alerts.choices import (
    SEVERITY_RANK,
    ChannelKind,
    NotificationState,
    Severity,
)
from apps.alerts.codes import NOTIFICATION_FAILED, NOTIFICATION_TEST
from apps.alerts.models import Alert, Notification, NotificationChannel
from apps.core.models import Installation

logger = logging.getLogger("apps.alerts.notify")

BATCH = 100
BATCHES_PER_SWEEP = 10
LOOKBACK = timedelta(days=1)  # events older than this when first seen are history, not news
MAX_DELAY_S = 3600
LEASE_SLACK_S = 60


class DeliveryFailed(Exception):
    """The channel did not take the message: what was tried and what came back."""


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Record new events, then deliver what is due. Returns counts for the task's result."""
    now = now or timezone.now()
    recorded = enqueue(now)
    sent, failed = deliver(now)
    return {"recorded": recorded, "sent": sent, "failed": failed}


def worker_pass(now: datetime | None = None) -> dict[str, int]:
    """The worker's pass (the ``alerts.notify`` task): a sweep, then the stamp the web processes' watchdog
    reads (``NOTIFY_STALLED``, apps/alerts/outages.py). A pass that crashes records why and raises again:
    the alert about it cannot travel through the pass that is failing."""
    try:
        result = sweep(now)
    except Exception as exc:
        try:
            Installation.objects.current().record_notify_crash(f"{type(exc).__name__}: {exc}")
        except Exception:  # the database itself gone: the stale stamp tells the watchdog anyway
            logger.warning("alert notification pass crashed; not recorded", exc_info=True)
        raise
    Installation.objects.current().record_notify_pass()
    return result


def enqueue(now: datetime) -> int:
    """One row per (channel, alert, event) not yet recorded, for alerts at or above the channel's
    severity raised since the channel was created (and within ``LOOKBACK``); cleared events only for
    alerts whose raising the channel would have seen. One channel's statement failing records nothing for
    it this pass and nothing less for the others."""
    notifications, alerts = Notification._meta.db_table, Alert._meta.db_table
    recorded = 0
    for channel in NotificationChannel.objects.filter(enabled=True):
        floor = SEVERITY_RANK[Severity(channel.min_severity)]
        severities = [str(s) for s, rank in SEVERITY_RANK.items() if rank >= floor]
        since = max(channel.created_at, now - LOOKBACK)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    INSERT INTO {notifications} (channel_id, alert_id, event, state, attempts,
                                                 next_attempt_at, last_error, created_at)
                    SELECT %(channel)s, a.id, e.event, 'pending', 0, %(now)s, '', %(now)s
                    FROM {alerts} a
                    CROSS JOIN (VALUES ('raised'), ('cleared')) AS e(event)
                    WHERE a.severity = ANY(%(severities)s) AND a.raised_at >= %(since)s
                      AND (e.event = 'raised' OR a.cleared_at IS NOT NULL)
                    ON CONFLICT (channel_id, alert_id, event) DO NOTHING
                    """,  # noqa: S608 -- the table names are ours; every value is a parameter
                    {"channel": channel.pk, "now": now, "severities": severities, "since": since},
                )
                recorded += cursor.rowcount
        except Exception:
            logger.exception("alert events for notification channel %r not recorded", channel.name)
    return recorded


@dataclass
class Delivery:
    """One batch of one channel on its way: claimed (its rows' next try moved to ``lease``), being sent on
    a thread of its own, due back by ``deadline`` (monotonic)."""

    channel: NotificationChannel
    batch: list[Notification]
    lease: datetime
    deadline: float
    number: int  # this channel's how-many-th batch in this pass


def deliver(now: datetime) -> tuple[int, int]:
    """Send what is due on every enabled channel; returns (events sent, events given up on).

    Channels are independent of each other (issue 47: one channel's crash once left every channel after
    it with nothing, and a webhook that never answered held up the rest):

    1. each channel's next batch is claimed in a short transaction of its own: its rows' next try moves
       to a lease (``FOR UPDATE SKIP LOCKED``, then the update), so no other pass takes them meanwhile
       and no transaction stays open while a remote end takes its time;
    2. each batch is sent on a thread of its own, which touches no database: every channel's send
       starts at once;
    3. as each send ends its outcome is recorded (``_record``), and that channel's next batch is claimed
       and sent, up to ``BATCHES_PER_SWEEP``; a send still going at ``MODELFORGE_NOTIFY_TIMEOUT_S`` is
       recorded as failed then and left behind (its thread ends with its own timeouts);
    4. whatever one channel throws (sending, recording) is logged and recorded on that channel: the
       pass goes on with the others.
    """
    sent = failed = 0
    going: dict[Future[None], Delivery] = {}

    def start(channel: NotificationChannel, number: int) -> None:
        try:
            delivery = _claim(channel, now, number)
        except Exception:
            logger.exception("notification channel %r: due events not claimed", channel.name)
            return
        if delivery is None:
            return
        batch = delivery.batch

        def sending() -> None:  # the batch's alerts were read with it: the thread makes no query
            send(channel, [event_payload(n.alert, n.event) for n in batch])

        going[_on_own_thread(channel, sending)] = delivery

    for channel in NotificationChannel.objects.filter(enabled=True):
        start(channel, 1)
    while going:
        soonest = min(d.deadline for d in going.values())
        done, _ = wait(going, timeout=max(0.0, soonest - time.monotonic()), return_when=FIRST_COMPLETED)
        ended = [(future, going.pop(future), _error_of(future)) for future in done]
        late = [future for future, d in going.items() if d.deadline <= time.monotonic()]
        ended += [(future, going.pop(future), _no_answer()) for future in late]
        for _, delivery, error in ended:
            outcome = _record(delivery, error, now)
            if outcome == "sent":
                sent += len(delivery.batch)
                if len(delivery.batch) == BATCH and delivery.number < BATCHES_PER_SWEEP:
                    start(delivery.channel, delivery.number + 1)
            elif outcome == "failed":
                failed += len(delivery.batch)
    return sent, failed


def _claim(channel: NotificationChannel, now: datetime, number: int) -> Delivery | None:
    # The lease outlasts the send's deadline: a pass that died mid-send leaves its rows due again then.
    lease = now + timedelta(seconds=settings.NOTIFY_TIMEOUT_S + LEASE_SLACK_S)
    with transaction.atomic():
        batch = list(
            Notification.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("alert")
            .filter(channel=channel, state=NotificationState.PENDING, next_attempt_at__lte=now)
            .order_by("created_at", "id")[:BATCH]
        )
        if not batch:
            return None
        Notification.objects.filter(pk__in=[n.pk for n in batch]).update(next_attempt_at=lease)
    return Delivery(channel, batch, lease, time.monotonic() + settings.NOTIFY_TIMEOUT_S, number)


def _on_own_thread(channel: NotificationChannel, sending: Callable[[], None]) -> Future[None]:
    """``sending`` on a daemon thread (one left behind never holds up the process's exit); whatever it
    raises is the future's, for the pass to record on the channel."""
    future: Future[None] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            sending()
        except BaseException as exc:  # handed to the pass, which records it on the channel
            future.set_exception(exc)
        else:
            future.set_result(None)

    threading.Thread(target=run, name=f"modelforge-notify-{channel.pk}", daemon=True).start()
    return future


def _no_answer() -> str:
    return f"no answer within {settings.NOTIFY_TIMEOUT_S} s (MODELFORGE_NOTIFY_TIMEOUT_S)"


def _error_of(future: Future[None]) -> str | None:
    """``None`` when the channel took the batch; otherwise what to record on the channel. A fault of ours
    (not a ``DeliveryFailed``) is logged with its traceback and recorded like any failure."""
    exc = future.exception()
    if exc is None:
        return None
    if isinstance(exc, DeliveryFailed):
        return str(exc)
    logger.error("sending alert events failed unexpectedly", exc_info=exc)
    return f"{type(exc).__name__}: {exc}"


def _record(delivery: Delivery, error: str | None, now: datetime) -> str:
    """``sent``, ``retrying``, ``failed`` (gave up) or ``unrecorded`` (recording threw: the rows come due
    again when their lease ends)."""
    channel, batch = delivery.channel, delivery.batch
    # Only rows still under this pass's lease: past it, another pass may have taken them.
    claimed = Notification.objects.filter(
        pk__in=[n.pk for n in batch], state=NotificationState.PENDING, next_attempt_at=delivery.lease
    )
    try:
        with transaction.atomic():
            if error is not None:
                return _failed(channel, batch, claimed, error, now)
            claimed.update(
                state=NotificationState.SENT, sent_at=now, last_error="", attempts=F("attempts") + 1
            )
            NotificationChannel.objects.filter(pk=channel.pk).update(last_success_at=now, last_error="")
            Alert.objects.clear_for([NOTIFICATION_FAILED], "notification_channel", str(channel.pk), now)
            return "sent"
    except Exception:
        logger.exception("notification channel %r: the outcome of a delivery was not recorded", channel.name)
        return "unrecorded"


def _failed(
    channel: NotificationChannel, batch: list[Notification], claimed: Any, error: str, now: datetime
) -> str:
    attempts = max(n.attempts for n in batch) + 1
    gave_up = attempts >= settings.NOTIFY_MAX_ATTEMPTS
    delay = min(settings.NOTIFY_INTERVAL * 2 ** (attempts - 1), MAX_DELAY_S)
    claimed.update(
        attempts=attempts,
        last_error=error[:2000],
        next_attempt_at=now + timedelta(seconds=delay),
        state=NotificationState.FAILED if gave_up else NotificationState.PENDING,
    )
    NotificationChannel.objects.filter(pk=channel.pk).update(last_failure_at=now, last_error=error[:2000])
    logger.warning("notification channel %r failed (attempt %s): %s", channel.name, attempts, error)
    # The message is stored as written: the channel's name and the remote end's reply are data.
    Alert.objects.raise_alert(
        NOTIFICATION_FAILED,
        Severity.WARNING,
        "notification_channel",
        str(channel.pk),
        channel.name,
        f"Channel {channel.name} could not deliver {len(batch)} alert event(s): {error[:300]}"
        + (" Gave up on them." if gave_up else f" Next try in {delay} s."),
        now,
    )
    return "failed" if gave_up else "retrying"


def event_payload(alert: Alert, event: str) -> dict[str, Any]:
    return {
        "event": event,
        "alert_id": alert.pk,
        "code": alert.code,
        "severity": alert.severity,
        "subject_type": alert.subject_type,
        "subject_id": alert.subject_id,
        "subject_name": alert.subject_name,
        "message": alert.message,
        "raised_at": alert.raised_at.isoformat(),
        "cleared_at": alert.cleared_at.isoformat() if alert.cleared_at else None,
        "occurrences": alert.occurrences,
    }


def send_test(channel: NotificationChannel) -> None:
    """One test message through the channel, now; records the outcome on the channel and raises
    ``DeliveryFailed`` with what came back."""
    now = timezone.now()
    event = {
        "event": "test",
        "alert_id": None,
        "code": NOTIFICATION_TEST,
        "severity": Severity.INFO.value,
        "subject_type": "notification_channel",
        "subject_id": str(channel.pk),
        "subject_name": channel.name,
        "message": f"A test message through channel {channel.name}.",
        "raised_at": now.isoformat(),
        "cleared_at": None,
        "occurrences": 1,
    }
    # As a pass sends: on a thread of its own, so a webhook that never finishes answering holds the
    # operator's request for MODELFORGE_NOTIFY_TIMEOUT_S at most, and any fault is a refusal, not a 500.
    future = _on_own_thread(channel, lambda: send(channel, [event]))
    done, _ = wait([future], timeout=settings.NOTIFY_TIMEOUT_S)
    error = _error_of(future) if done else _no_answer()
    if error is not None:
        NotificationChannel.objects.filter(pk=channel.pk).update(last_failure_at=now, last_error=error[:2000])
        raise DeliveryFailed(error)
    NotificationChannel.objects.filter(pk=channel.pk).update(last_success_at=now, last_error="")


def send(channel: NotificationChannel, events: list[dict[str, Any]]) -> None:
    if channel.kind == ChannelKind.WEBHOOK:
        _post(channel, events)
    elif channel.kind == ChannelKind.EMAIL:
        _mail(channel, events)
    else:
        raise DeliveryFailed(f"unknown channel kind {channel.kind!r}")


def _post(channel: NotificationChannel, events: list[dict[str, Any]]) -> None:
    body = json.dumps(
        {"source": "modelforge", "channel": channel.name, "events": events}, separators=(",", ":")
    ).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "ModelForge-notify"}
    if channel.secret:
        signature = hmac.new(channel.secret.encode(), body, hashlib.sha256).hexdigest()
        headers["X-ModelForge-Signature"] = f"sha256={signature}"
    try:
        response = httpx.post(
            channel.target, content=body, headers=headers, timeout=settings.NOTIFY_TIMEOUT_S
        )
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        # InvalidURL is not an HTTPError: a host that is not a valid IDNA name was a 500 (issue 13).
        raise DeliveryFailed(f"POST {channel.target} failed: {type(exc).__name__}: {exc}") from None
    if not 200 <= response.status_code < 300:
        raise DeliveryFailed(f"POST {channel.target} answered {response.status_code}: {response.text[:200]}")


def _mail(channel: NotificationChannel, events: list[dict[str, Any]]) -> None:
    if not settings.EMAIL_URL:
        raise DeliveryFailed("MODELFORGE_EMAIL_URL is not set, so e-mail channels cannot send")
    first = events[0]
    subject = f"[ModelForge] {first['code']} {first['event']}: {first['subject_name']}"
    if len(events) > 1:
        subject += f" (and {len(events) - 1} more)"
    # A name is data: a line break in one would be a header injection (Django refuses it with an error).
    subject = " ".join(subject.split())
    lines = [
        f"{e['event'].upper():8} {e['severity']:8} {e['code']} on {e['subject_type']} {e['subject_name']}\n"
        f"         {e['message']}\n"
        f"         raised {e['raised_at']}" + (f", cleared {e['cleared_at']}" if e["cleared_at"] else "")
        for e in events
    ]
    addresses = [a.strip() for a in channel.target.split(",") if a.strip()]
    try:
        EmailMessage(subject, "\n\n".join(lines) + "\n", settings.DEFAULT_FROM_EMAIL, addresses).send()
    except (smtplib.SMTPException, OSError) as exc:
        raise DeliveryFailed(
            f"sending e-mail through {settings.EMAIL_HOST}: {type(exc).__name__}: {exc}"
        ) from None
