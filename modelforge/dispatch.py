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
import threading
import time
from typing import Any

from django.db import transaction

from modelforge.errors import ApiError, codes

logger = logging.getLogger("modelforge.dispatch")


class _Outage:
    """This process's view of the broker, so that an outage is logged once when it starts and once when
    it ends, not once per task (a frozen Redis met by every request would otherwise fill the log)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self.unsent = 0

    def failed(self, task: Any, args: tuple[Any, ...], exc: Exception) -> None:
        with self._lock:
            first = self.since is None
            if first:
                self.since = time.monotonic()
            self.unsent += 1
        if first:
            logger.warning(
                "the broker did not answer (%s: %s) when sending task %s%s; tasks are not sent until it "
                "answers again, their rows are kept and the watchdog re-sends them",
                type(exc).__name__,
                exc,
                getattr(task, "name", task),
                args,
            )
        else:
            logger.debug("task %s%s not sent, the broker is still away", getattr(task, "name", task), args)

    def sent(self) -> None:
        if self.since is None:  # (read without the lock: the common case, nothing to say)
            return
        with self._lock:
            since, unsent = self.since, self.unsent
            self.since, self.unsent = None, 0
        if since is not None:
            logger.warning(
                "the broker answers again after %.0f s; %d task(s) not sent meanwhile are re-sent by the "
                "watchdog",
                time.monotonic() - since,
                unsent,
            )


_outage = _Outage()


def send(task: Any, *args: Any, countdown: float | None = None, queue: str | None = None) -> bool:
    """Send now; False (logged) when the broker cannot take it. Publishing is not retried here: the
    watchdog re-sends, and a request must not wait out the broker's connection retries. Every connect
    and reply is bounded by ``BROKER_TIMEOUT_S`` (the transport's socket timeouts, settings.py), so a
    broker that is frozen rather than down fails here within that bound too."""
    try:
        if queue:
            task.apply_async(args, countdown=countdown, retry=False, queue=queue)
        else:
            task.apply_async(args, countdown=countdown, retry=False)
    except Exception as exc:  # kombu's OperationalError, a socket error, a Redis error: the broker is away
        _outage.failed(task, args, exc)
        return False
    _outage.sent()
    return True


def send_on_commit(task: Any, *args: Any, countdown: float | None = None, queue: str | None = None) -> None:
    """Send once the surrounding transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send(task, *args, countdown=countdown, queue=queue))


def send_or_refuse(task: Any, *args: Any) -> str:
    """Send now and return the task's id, or refuse with ``503 BROKER_UNREACHABLE``: for work that has no
    row for the watchdog to re-send (a node ping, a worker probe), so a send the broker did not take would
    otherwise be lost in silence. Bounded as ``send`` is."""
    try:
        result = task.apply_async(args, retry=False)
    except Exception as exc:  # as in send: the broker is away, or did not answer within its bound
        _outage.failed(task, args, exc)
        raise ApiError(
            codes.BROKER_UNREACHABLE,
            "The broker (Redis) did not take the task. Nothing was sent: try again once it answers "
            "(GET /readyz says when).",
            status=503,
            headers={"retry-after": "5"},
        ) from None
    _outage.sent()
    return str(result.id)
