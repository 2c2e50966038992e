"""An acquisition runs under a PostgreSQL advisory lock held for its whole life (apps.core.pglocks): a
second delivery of the same task skips, and the stuck-work watchdog tells a dead acquisition (lock
free) from a slow one at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from apps.core import pglocks

# The second key of an acquisition's lock; backups use 1 << 28 and 1 << 30 (apps.backups.pgtools).
ACQUIRE_LOCK_BASE = 1 << 29


def lock_key(artifact_id: int) -> int:
    return ACQUIRE_LOCK_BASE + int(artifact_id)


@contextmanager
def acquiring(artifact_id: int) -> Iterator[Any]:
    """Held while this process acquires ``artifact_id``; raises ``pglocks.LockHeld`` if another does."""
    with pglocks.liveness_lock(pglocks.service_server(), lock_key(artifact_id)) as conn:
        yield conn


def is_acquiring(artifact_id: int) -> bool:
    with pglocks.service_server().maintenance() as conn:
        return pglocks.is_alive(conn, lock_key(artifact_id))
