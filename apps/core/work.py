"""Work is never stranded: every state that waits on something has a bound.

Each kind of waiting row is described once, by the app that owns the rows (``apps/<app>/work.py``, given
to ``register`` at its ``AppConfig.ready()``): which rows wait, since when, how to send their task again
(idempotent: every task claims its row first) and how an operator marks one failed. This module knows no
app; it walks what was registered. The ``core.watch_work`` beat task (``MODELFORGE_WORK_WATCH_INTERVAL``)
walks them:

1. a row that waited past ``resend_after`` has its task sent again: a message lost to a broker outage,
   or a task chain broken by a killed worker, costs a delay, never the work;
2. a copying replica and a starting server whose watch went quiet are looked at from here, with the
   agent's own report (no message in the broker needed to finish them): a kind's ``look``;
3. a row that waited past ``stuck_after`` is stuck: ``watched`` is sent with the stuck rows, and
   apps.alerts raises ``WORK_STUCK`` (warning) naming the row, what it waits on, since when, and the way
   out (retry, or mark failed: API ``/api/v1/system/work``, the admin, the dashboard's Work page); it
   clears when the row moves on (and at once when an operator marks it failed: ``marked_failed``).

A row whose worker died under an advisory lock (backups, restores, acquisitions) is recognised at once
by its free lock; the others by time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.dispatch import Signal
from django.utils import timezone

from modelforge.errors import ApiError

logger = logging.getLogger(__name__)

WORK_STUCK = "WORK_STUCK"
WORK_NOT_WAITING = "WORK_NOT_WAITING"
WORK_KIND_UNKNOWN = "WORK_KIND_UNKNOWN"
WORK_CANCELLED = "WORK_CANCELLED"

# A watch chain that re-enqueues itself every second is quiet for this long only if it is gone.
WATCH_QUIET_S = 15

# After each watchdog pass, with ``stuck`` (the rows past their bound, a list of ``Waiting``) and ``now``.
watched = Signal()
# After an operator marked a row failed, with ``kind`` and ``pk``.
marked_failed = Signal()


@dataclass(frozen=True)
class Waiting:
    """One row waiting on background work, as the watchdog and the operator see it."""

    kind: str
    id: str
    name: str
    state: str
    waits_on: str
    since: datetime
    resend_after: int
    stuck_after: int
    row: Any

    def age(self, now: datetime) -> float:
        return (now - self.since).total_seconds()

    def as_dict(self, now: datetime) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "waits_on": self.waits_on,
            "since": self.since,
            "age_seconds": round(self.age(now), 1),
            "stuck_after_seconds": self.stuck_after,
            "stuck": self.age(now) > self.stuck_after,
        }


@dataclass(frozen=True)
class Kind:
    """One kind of waiting row, contributed by the app that owns the rows.

    ``position`` orders the kinds wherever they are listed (the Work page's filter, the API's enum, a
    refusal naming them), whatever order the apps load in. ``retry`` is the operator's retry; ``resend``
    the watchdog's re-send when it differs (an acquisition whose worker died is retried by the operator,
    never by the clock); ``look`` looks at a row whose watch may have gone quiet, on each pass.
    """

    name: str
    label: str
    position: int
    waiting: Callable[[], Iterable[Waiting]]
    retry: Callable[[Any], None]
    fail: Callable[[Any, str], None]
    resend: Callable[[Any], None] | None = None
    look: Callable[[Waiting, datetime], None] | None = None


# Every registered kind by name, in ``position`` order.
KINDS: dict[str, Kind] = {}


def register(*kinds: Kind) -> None:
    """Add kinds of waiting work (an app's ``ready()``); a kind registered again replaces itself."""
    every = {**KINDS, **{kind.name: kind for kind in kinds}}
    KINDS.clear()
    KINDS.update(sorted(every.items(), key=lambda named: named[1].position))


def bound(name: str) -> int:
    """A bound from settings (``WORK_RESEND_AFTER``, ``WORK_STUCK_AFTER``...), in seconds."""
    return int(getattr(settings, name))


def moved_on(kind: str, pk: Any) -> ApiError:
    """The refusal for a row that is no longer waiting (someone else moved it first)."""
    return ApiError(WORK_NOT_WAITING, f"The {kind} {pk} is not waiting any more; nothing was changed.", 409)


def waiting(now: datetime | None = None) -> list[Waiting]:
    """Every row waiting on background work, oldest first."""
    rows = [item for kind in KINDS.values() for item in kind.waiting()]
    return sorted(rows, key=lambda item: item.since)


def watch(now: datetime | None = None) -> dict[str, int]:
    """One pass of the watchdog: look, re-send, and say which rows are stuck (``watched``)."""
    now = now or timezone.now()
    resent = looked = 0
    for item in waiting(now):
        kind = KINDS[item.kind]
        if kind.look is not None:
            try:
                kind.look(item, now)
                looked += 1
            except Exception:
                logger.exception("watchdog could not look at %s %s", item.kind, item.id)
        if item.age(now) > item.resend_after:
            (kind.resend or kind.retry)(item.row)
            resent += 1
    stuck = [item for item in waiting(now) if item.age(now) > item.stuck_after]
    watched.send(sender=Waiting, stuck=stuck, now=now)
    return {"resent": resent, "looked": looked, "stuck": len(stuck)}


def find(kind: str, pk: str) -> Waiting:
    if kind not in KINDS:
        raise ApiError(
            WORK_KIND_UNKNOWN, f"No kind of work is called {kind!r}; use one of {', '.join(KINDS)}.", 404
        )
    for item in KINDS[kind].waiting():
        if item.id == str(pk):
            return item
    raise moved_on(kind, pk)


def retry(kind: str, pk: str, by: str) -> Waiting:
    """Send the row's task again (or look, for a copying replica); the row as it is afterwards."""
    item = find(kind, pk)
    KINDS[kind].retry(item.row)
    logger.warning("%s %s: retry requested by %s", kind, pk, by)
    try:
        return find(kind, pk)
    except ApiError:
        return item  # it moved on at once (a replica found present)


def fail(kind: str, pk: str, by: str) -> None:
    item = find(kind, pk)
    KINDS[kind].fail(item.row, by)
    marked_failed.send(sender=Waiting, kind=kind, pk=str(pk))
    logger.warning("%s %s: marked failed by %s", kind, pk, by)


def past_bound_count(now: datetime | None = None) -> int:
    now = now or timezone.now()
    return sum(1 for item in waiting(now) if item.age(now) > item.stuck_after)
