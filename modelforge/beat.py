"""The beat scheduler: django-celery-beat's, refusing to start on bad configuration first.

Beat builds its scheduler (which reads the database) before the ``beat_init`` signal fires, so the
start-up checks run here, in the scheduler's constructor, before anything touches the database.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler

from modelforge.startup import run_entry_checks

logger = logging.getLogger(__name__)


class Scheduler(DatabaseScheduler):
    """``DatabaseScheduler`` (schedules editable in the admin) behind ModelForge's start-up checks, stamping
    the installation as it ticks: the web processes raise ``BEAT_MISSING`` when the stamp goes stale."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        run_entry_checks("celery beat")
        self._stamped_at: float | None = None
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        delay: float = super().tick(*args, **kwargs)
        self._stamp()
        return delay

    def _stamp(self) -> None:
        """Three times per ``MODELFORGE_BEAT_MISSING_AFTER`` (at most every 15 s); a database that does not
        answer is logged, never fatal to beat."""
        from django.db import DatabaseError, close_old_connections

        from apps.core.outages import beat_stamp_s, record_beat_seen

        now = time.monotonic()
        if self._stamped_at is not None and now - self._stamped_at < beat_stamp_s():
            return
        try:
            record_beat_seen(socket.gethostname())
        except DatabaseError as exc:
            logger.warning("beat's stamp not recorded (%s); BEAT_MISSING may be raised", type(exc).__name__)
            close_old_connections()
            return
        self._stamped_at = now
