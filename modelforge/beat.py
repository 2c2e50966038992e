"""The beat scheduler: django-celery-beat's, refusing to start on bad configuration first, and one active
beat per installation however many run.

Beat builds its scheduler (which reads the database) before the ``beat_init`` signal fires, so the
start-up checks run here, in the scheduler's constructor, before anything touches the database.

Several beats (issue 19): each holds or waits for a PostgreSQL session-level advisory lock, taken on a
plain connection of its own that lives as long as the process. The holder is the *leader* and schedules;
the others are *standbys*: they send nothing and try the lock again every ``MODELFORGE_BEAT_STANDBY_RETRY_S``.
PostgreSQL releases the lock when the leader's session ends, however the process ends (SIGKILL, a lost
machine: the session's TCP keepalives are set short so a vanished host is noticed within
``LEADER_KEEPALIVE_S``), so no lease length is guessed. The leader checks its lock session before every
tick; a session that no longer answers makes it a standby at once.

A lock alone cannot promise "no period run twice": the old leader wrote its ``last_run_at`` bookkeeping
only every few minutes (``sync``), and a leader cut off from PostgreSQL may send one more message before it
notices. So every send is also *claimed* in Redis, the broker itself: ``SET NX`` on the entry's name with
an expiry of 90 % of its period. A send whose claim is taken is skipped and logged; a claim that cannot be
made (Redis down) skips the send too, since the message could not be delivered either.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import zlib
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis
from django.conf import settings
from django_celery_beat.schedulers import DatabaseScheduler

from modelforge.signals import beat_ticked
from modelforge.startup import run_entry_checks

logger = logging.getLogger("modelforge.beat")

# Advisory-lock namespace (the first key of the two-key form): "MFBT", mixed with the service database's
# name so that two installations (or two test runs) sharing one PostgreSQL server never wait on each other.
LOCK_NAMESPACE = 0x4D464254
LEADER_KEY = 1
# TCP keepalives of the lock session, set on the server's side of it: a leader whose machine vanished
# without closing its socket loses the lock after about idle + interval * count seconds.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 5, 2, 3
LEADER_KEEPALIVE_S = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT
# A standby says it is waiting at start and then this often, so its log shows it alive.
STANDBY_LOG_EVERY_S = 300.0
CLAIM_PREFIX = "modelforge:beat:sent:"
# Each beat says its role here (``leader`` or ``standby``), refreshed every retry and expiring after three:
# ``redis-cli --scan --pattern 'modelforge:beat:role:*'`` lists the beats alive and which one leads.
ROLE_PREFIX = "modelforge:beat:role:"
CLAIM_SHARE = 0.9


def lock_namespace() -> int:
    name = str(settings.DATABASES["default"]["NAME"])
    return (LOCK_NAMESPACE ^ zlib.crc32(name.encode())) & 0x7FFFFFFF


class LeaderLock:
    """The beat leader lock on a plain psycopg connection of its own (not Django's, which beat closes and
    reopens between ticks)."""

    def __init__(self) -> None:
        self._conn: psycopg.Connection[Any] | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        db = settings.DATABASES["default"]
        conn = psycopg.connect(
            host=db.get("HOST") or "127.0.0.1",
            port=int(db.get("PORT") or 5432),
            user=db.get("USER") or "postgres",
            password=db.get("PASSWORD") or None,
            dbname=db["NAME"],
            autocommit=True,
            application_name="modelforge-beat-leader",
            connect_timeout=5,
            keepalives=1,
            keepalives_idle=KEEPALIVE_IDLE_S,
            keepalives_interval=KEEPALIVE_INTERVAL_S,
            keepalives_count=KEEPALIVE_COUNT,
        )
        conn.execute(
            "SELECT set_config('tcp_keepalives_idle', %s, false), set_config('tcp_keepalives_interval', %s,"
            " false), set_config('tcp_keepalives_count', %s, false), set_config('statement_timeout', '5s',"
            " false)",
            (str(KEEPALIVE_IDLE_S), str(KEEPALIVE_INTERVAL_S), str(KEEPALIVE_COUNT)),
        )
        return conn

    @property
    def held(self) -> bool:
        return self._conn is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; any failure to reach PostgreSQL is "not taken"."""
        if self._conn is not None:
            return True
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._connect()
            row = conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (lock_namespace(), LEADER_KEY)
            ).fetchone()
        except psycopg.Error as exc:
            logger.warning("beat standby: the leader lock could not be tried (%s)", type(exc).__name__)
            if conn is not None:
                conn.close()
            return False
        if not (row and row[0]):
            conn.close()
            return False
        self._conn = conn
        return True

    def still_held(self) -> bool:
        """The lock session still answers (so PostgreSQL still holds the lock for it)."""
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1").fetchone()
        except psycopg.Error as exc:
            logger.error(
                "beat leader: the leader lock's session failed (%s); no longer leader", type(exc).__name__
            )
            self.release()
            return False
        return True

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


def claim_period(client: redis.Redis, name: str, period_s: float) -> bool:
    """Claim this period of entry ``name``: True for the first send within 90 % of its period, False for
    any other (another beat, or this one after a takeover, already sent it). Raises on Redis errors."""
    ttl_ms = max(1000, int(period_s * CLAIM_SHARE * 1000))
    stamp = datetime.now(UTC).isoformat()
    return bool(client.set(CLAIM_PREFIX + name, f"{socket.gethostname()} {stamp}", nx=True, px=ttl_ms))


class Scheduler(DatabaseScheduler):
    """``DatabaseScheduler`` (schedules editable in the admin) behind ModelForge's start-up checks, active
    only while it holds the leader lock, saying ``beat_ticked`` as it ticks as leader: apps.core stamps the
    installation on it, and the web processes raise ``BEAT_MISSING`` when the stamp goes stale."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        run_entry_checks("celery beat")
        self._hostname = socket.gethostname()
        self._lock = LeaderLock()
        self._standby_logged_at: float | None = None
        self._claims: redis.Redis | None = None
        self._role_said: tuple[str, float] | None = None
        super().__init__(*args, **kwargs)

    @property
    def role(self) -> str:
        return "leader" if self._lock.held else "standby"

    def tick(self, *args: Any, **kwargs: Any) -> float:
        retry = float(settings.BEAT_STANDBY_RETRY_S)
        if self._lock.held and not self._lock.still_held():
            self._standby_logged_at = None
        if not self._lock.held:
            if not self._lock.try_acquire():
                now = time.monotonic()
                if self._standby_logged_at is None or now - self._standby_logged_at >= STANDBY_LOG_EVERY_S:
                    logger.info(
                        "beat standby on %s: another beat holds the leader lock; trying again every %g s",
                        self._hostname,
                        retry,
                    )
                    self._standby_logged_at = now
                self._say_role(retry)
                return retry
            logger.info("beat leader on %s: holds the leader lock, scheduling", self._hostname)
            # Read the schedule afresh: the previous leader's last_run_at is in the database.
            self._initial_read = True
            self._heap = None
        delay: float = super().tick(*args, **kwargs)
        beat_ticked.send(sender=type(self), hostname=self._hostname)
        self._say_role(retry)
        # A leader never sleeps past the standby's retry: it checks its lock at least that often.
        return min(delay, retry)

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        period_s = _period_s(entry)
        try:
            claimed = claim_period(self._claim_client(), entry.name, period_s)
        except (redis.RedisError, OSError) as exc:
            logger.error(
                "beat: %s not sent, its period could not be claimed (%s)", entry.name, type(exc).__name__
            )
            return None
        if not claimed:
            logger.warning("beat: %s not sent, this period was already sent by a beat", entry.name)
            return None
        return super().apply_async(entry, producer=producer, advance=advance, **kwargs)

    def _say_role(self, retry: float) -> None:
        """Best effort: a Redis that does not answer costs the key, never a tick."""
        now, role = time.monotonic(), self.role
        if self._role_said is not None and self._role_said[0] == role and now - self._role_said[1] < retry:
            return
        try:
            key = f"{ROLE_PREFIX}{self._hostname}:{os.getpid()}"
            self._claim_client().set(key, role, ex=int(3 * retry) + 1)
        except (redis.RedisError, OSError):
            return
        self._role_said = (role, now)

    def _claim_client(self) -> redis.Redis:
        if self._claims is None:
            self._claims = redis.Redis.from_url(
                settings.CELERY_BROKER_URL, socket_connect_timeout=2, socket_timeout=2
            )
        return self._claims

    def close(self) -> None:
        super().close()
        self._lock.release()


def _period_s(entry: Any) -> float:
    """The entry's period: the interval of an interval schedule, the time from now to the next run for a
    crontab (a daily backup: about a day)."""
    try:
        schedule = entry.schedule
        return float(schedule.remaining_estimate(schedule.now()).total_seconds())
    except Exception:  # an exotic schedule: claim for one second, the least
        return 1.0
