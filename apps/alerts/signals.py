"""The platform's own receivers of the kernel's process signals: each web worker watches for outages,
beat stamps that it is alive, and a worker task that failed on the database is noted for the outage's
alert (``apps.alerts.outages``). Connected when ``AlertsConfig.ready()`` imports this module."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import signals as celery_signals
from django.db import DatabaseError, close_old_connections
from django.dispatch import receiver

from modelforge.signals import beat_ticked, web_worker_started

logger = logging.getLogger("modelforge.beat")


@receiver(web_worker_started)
def _watch_outages(**kwargs: Any) -> None:
    """BROKER_UNREACHABLE, DATABASE_UNREACHABLE (recorded when it answers again), WORKER_MISSING,
    BEAT_MISSING: every web worker watches the platform's own stores and processes."""
    from apps.alerts.outages import OutageTicker

    OutageTicker().start()


_beat_stamped_at: float | None = None


@receiver(beat_ticked)
def _stamp_beat(hostname: str = "", **kwargs: Any) -> None:
    """Three times per ``MODELFORGE_BEAT_MISSING_AFTER`` (at most every 15 s); a database that does not
    answer is logged, never fatal to beat. The web processes raise ``BEAT_MISSING`` when it goes stale."""
    global _beat_stamped_at
    from apps.alerts.outages import beat_stamp_s, record_beat_seen

    now = time.monotonic()
    if _beat_stamped_at is not None and now - _beat_stamped_at < beat_stamp_s():
        return
    try:
        record_beat_seen(hostname)
    except DatabaseError as exc:
        logger.warning("beat's stamp not recorded (%s); BEAT_MISSING may be raised", type(exc).__name__)
        close_old_connections()
        return
    _beat_stamped_at = now


@celery_signals.task_failure.connect
def _note_database_failure(
    sender: Any = None, task_id: str | None = None, exception: BaseException | None = None, **_: Any
) -> None:
    """A task that failed because the database was away is noted in Redis (nothing can be written to the
    database then): the web processes name it in the DATABASE_UNREACHABLE they record when it returns."""
    from apps.alerts.outages import record_failed_task

    record_failed_task(getattr(sender, "name", str(sender)), task_id or "", exception)
