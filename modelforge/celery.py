"""The Celery application: one place, settings under ``CELERY_*``, tasks autodiscovered from apps."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")

app = Celery("modelforge")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Not "correlation_id": Celery already uses that name for the task id.
CORRELATION_HEADER = "modelforge_correlation_id"


@signals.before_task_publish.connect
def _carry_correlation_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """A task enqueued while serving a request carries the request's correlation id..."""
    from modelforge.logging import NO_CORRELATION, current_correlation_id

    correlation_id = current_correlation_id()
    if headers is not None and correlation_id != NO_CORRELATION:
        headers.setdefault(CORRELATION_HEADER, correlation_id)


@signals.task_prerun.connect
def _adopt_correlation_id(task: Any = None, **_: Any) -> None:
    """...and the worker logs the task under it, so one id tells the whole story."""
    from modelforge.logging import NO_CORRELATION, set_correlation_id

    set_correlation_id(getattr(task.request, CORRELATION_HEADER, None) or NO_CORRELATION)


@signals.worker_init.connect
def _refuse_bad_worker_start(**_: Any) -> None:
    from modelforge.startup import run_entry_checks

    run_entry_checks("celery worker")
