"""An acquisition runs under a PostgreSQL advisory lock held for its whole life (apps.backups.pgtools): a
second delivery of the same task skips, and the stuck-work watchdog tells a dead acquisition (lock
free) from a slow one at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from apps.backups import pgtools


def lock_key(artifact_id: int) -> int:
    return pgtools.ACQUIRE_LOCK_BASE + int(artifact_id)


@contextmanager
def acquiring(artifact_id: int) -> Iterator[Any]:
    """Held while this process acquires ``artifact_id``; raises ``pgtools.LockHeld`` if another does."""
    with pgtools.liveness_lock(pgtools.service_server(), lock_key(artifact_id)) as conn:
        yield conn


def is_acquiring(artifact_id: int) -> bool:
    with pgtools.service_server().maintenance() as conn:
        return pgtools.is_alive(conn, lock_key(artifact_id))
