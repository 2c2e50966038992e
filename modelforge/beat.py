"""The beat scheduler: django-celery-beat's, refusing to start on bad configuration first.

Beat builds its scheduler (which reads the database) before the ``beat_init`` signal fires, so the
start-up checks run here, in the scheduler's constructor, before anything touches the database.
"""

from __future__ import annotations

from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler

from modelforge.startup import run_entry_checks


class Scheduler(DatabaseScheduler):
    """``DatabaseScheduler`` (schedules editable in the admin) behind ModelForge's start-up checks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        run_entry_checks("celery beat")
        super().__init__(*args, **kwargs)
