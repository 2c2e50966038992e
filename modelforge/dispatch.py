"""Sending work to the Celery worker without ever stranding it or answering 500 for a broker outage.

The row that asks for background work is the intent: it commits first, then ``send_on_commit`` hands
the task to the broker. If the broker is down at that moment, the send is logged and dropped, never
raised into the request (the API still answers 202: the work is recorded), and the watchdog
(``apps.core.work``) re-sends every task whose row has waited past its bound once the broker answers.
So a broker outage delays work, never strands it; every task body claims its row before working
(compare-and-swap on the state, or an advisory lock), so a task sent twice runs once.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

logger = logging.getLogger("modelforge.dispatch")


def send(task: Any, *args: Any, countdown: float | None = None, queue: str | None = None) -> bool:
    """Send now; False (logged) when the broker cannot take it. Publishing is not retried here: the
    watchdog re-sends, and a request must not wait out the broker's connection retries."""
    try:
        if queue:
            task.apply_async(args, countdown=countdown, retry=False, queue=queue)
        else:
            task.apply_async(args, countdown=countdown, retry=False)
    except Exception as exc:  # kombu's OperationalError, a socket error, a Redis error: the broker is away
        logger.warning(
            "task %s%s not sent, the broker did not take it (%s: %s); the watchdog re-sends it",
            getattr(task, "name", task),
            args,
            type(exc).__name__,
            exc,
        )
        return False
    return True


def send_on_commit(task: Any, *args: Any, countdown: float | None = None, queue: str | None = None) -> None:
    """Send once the surrounding transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send(task, *args, countdown=countdown, queue=queue))
