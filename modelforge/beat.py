"""The beat scheduler: django-celery-beat's, refusing to start on bad configuration first.

Beat builds its scheduler (which reads the database) before the ``beat_init`` signal fires, so the
start-up checks run here, in the scheduler's constructor, before anything touches the database.
"""

from __future__ import annotations

import socket
from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler

from modelforge.signals import beat_ticked
from modelforge.startup import run_entry_checks


class Scheduler(DatabaseScheduler):
    """``DatabaseScheduler`` (schedules editable in the admin) behind ModelForge's start-up checks, saying
    ``beat_ticked`` as it ticks: apps.core stamps the installation on it, and the web processes raise
    ``BEAT_MISSING`` when the stamp goes stale."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        run_entry_checks("celery beat")
        self._hostname = socket.gethostname()
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        delay: float = super().tick(*args, **kwargs)
        beat_ticked.send(sender=type(self), hostname=self._hostname)
        return delay
