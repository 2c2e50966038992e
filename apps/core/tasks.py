"""Thin Celery wrappers over the core models."""

from __future__ import annotations

import logging
import socket

from celery import shared_task

from apps.core.models import Installation

logger = logging.getLogger(__name__)


@shared_task(name="core.record_worker_seen")
def record_worker_seen() -> str:
    """Stamp the installation with this worker's host and the time: proof a worker consumes tasks."""
    hostname = socket.gethostname()
    Installation.objects.current().record_worker_seen(hostname)
    logger.info("worker on %s ran the probe", hostname)
    return hostname


@shared_task(name="core.watch_work")
def watch_work() -> dict[str, int]:
    """Re-send the tasks of rows that waited past their bound, look at quiet watches, raise WORK_STUCK."""
    from apps.core import work

    return work.watch()
