"""The control plane's own absence is not the nodes' absence.

Silence is counted only over time the control plane was listening: ``ListeningClock.listening_since``
moves forward whenever heartbeats could not have been received, and the liveness sweep measures a
node's silence from ``max(last heartbeat, listening_since)``. Three things move it:

1. the web processes' stamp (``web_tick``, every ``WEB_TICK_S`` from each web worker): a stamp older
   than ``MODELFORGE_LISTENING_GAP`` when the next arrives means no web process was there to listen;
2. the sweep itself (``liveness.sweep``): sweeps that stopped for longer than the gap mean the worker,
   beat, broker or database were away (the database stopping also stops the web stamps);
3. a restore's switch-over (``resumed``), and a restored row whose stamps are old anyway.

Kubernetes' node lifecycle controller does the same: its grace period starts at its own first
observation, not at a timestamp it did not watch pass.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from apps.alerts.models import Alert
from apps.nodes import codes
from apps.nodes.models import ListeningClock
from apps.nodes.signals import listening_restarted
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)

WEB_TICK_S = 5.0
MASS_LOSS_SUBJECT = ("fleet", "liveness")


def current() -> ListeningClock:
    clock, _ = ListeningClock.objects.get_or_create(singleton=True)
    return clock


def locked() -> ListeningClock:
    """The row under a lock (inside a transaction): sweeps and confirmations are serialised on it."""
    current()
    return ListeningClock.objects.select_for_update().get(singleton=True)


def listening_since() -> datetime | None:
    """Since when the control plane has been listening (``None`` before the clock's first row): the outage
    checks (apps.alerts.outages) judge no silence from before it either."""
    since: datetime | None = ListeningClock.objects.values_list("listening_since", flat=True).first()
    return since


def web_tick(now: datetime | None = None) -> None:
    """A web process is listening now; if none was for longer than the gap, the grace period restarts."""
    now = now or timezone.now()
    gap = now - timedelta(seconds=settings.LISTENING_GAP)
    # The usual stamp, the last one inside the gap: one statement (this runs in every web worker every
    # few seconds; three statements were most of the listening thread's CPU, bench/gateway/idle.py).
    if ListeningClock.objects.filter(singleton=True, web_seen_at__gte=gap).update(web_seen_at=now):
        return
    current()
    after_gap = Q(web_seen_at__isnull=True) | Q(web_seen_at__lt=gap)
    restarted = ListeningClock.objects.filter(after_gap, singleton=True).update(
        listening_since=now, listening_reason="web processes started listening after a gap", web_seen_at=now
    )
    if restarted:
        # Nodes silent only while nobody listened are heard again: the routing tables, which leave out the
        # servers of nodes not heard, are rebuilt now rather than at their next periodic rebuild.
        listening_restarted.send(sender=web_tick, at=now)
    else:
        ListeningClock.objects.filter(singleton=True).update(
            listening_since=Case(When(after_gap, then=Value(now)), default=F("listening_since")),
            listening_reason=Case(
                When(after_gap, then=Value("web processes started listening after a gap")),
                default=F("listening_reason"),
            ),
            web_seen_at=now,
        )


def resumed(reason: str, now: datetime | None = None) -> None:
    """The control plane could not hear its nodes until now (a restore's switch-over): restart grace."""
    now = now or timezone.now()
    current()
    ListeningClock.objects.filter(singleton=True).update(
        listening_since=now, listening_reason=reason[:255], swept_at=now
    )
    transaction.on_commit(lambda: listening_restarted.send(sender=resumed, at=now))
    logger.warning("listening again from %s: %s", now.isoformat(), reason)


def confirm_mass_loss(by: str, now: datetime | None = None) -> ListeningClock:
    """The operator says the fleet really went silent: the held nodes may go offline at the next sweep."""
    now = now or timezone.now()
    with transaction.atomic():
        clock = locked()
        if clock.hold_since is None:
            raise ApiError(
                codes.NODE_MASS_LOSS_NOT_HELD,
                "No mass loss is being held: there is nothing to confirm.",
                409,
            )
        clock.confirmed_at = now
        clock.confirmed_by = by[:150]
        clock.hold_since = None
        clock.hold_nodes = 0
        clock.save(update_fields=["confirmed_at", "confirmed_by", "hold_since", "hold_nodes"])
        Alert.objects.clear_for([codes.ALERT_NODE_MASS_LOSS], *MASS_LOSS_SUBJECT, at=now)
    logger.warning("mass node loss confirmed by %s", by)
    return clock


class WebTicker:
    """The web worker's listening stamp, on a daemon thread of its own (the event loop never waits on it)."""

    def __init__(self, interval_s: float | None = None) -> None:
        # Stamps well inside the gap (a third of it, at most every WEB_TICK_S), or the stamps themselves
        # would look like gaps and restart every grace period.
        self.interval_s = interval_s or max(1.0, min(WEB_TICK_S, settings.LISTENING_GAP / 3))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="modelforge-listening", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                web_tick()
            except Exception as exc:  # the database away: the gap is what the next stamp will notice
                logger.warning("listening stamp not recorded: %s", type(exc).__name__)
            finally:
                close_old_connections()
            self.stop.wait(self.interval_s)
