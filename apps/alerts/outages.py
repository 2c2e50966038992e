"""Outages of the platform's own stores and processes, each a named critical alert.

Nothing else tells an operator that the platform itself has stopped: a dead worker or beat, or an
unreachable broker, also stops the worker's own alert delivery, and an unreachable database cannot take
an alert at all. So every web process runs an ``OutageTicker`` (started on the kernel's
``web_worker_started``: apps.alerts.signals) that, every ``MODELFORGE_OUTAGE_CHECK_INTERVAL`` seconds:

1. makes a new database connection (never a pooled one: pooled sessions can answer while no new one can
   be made). While none can be made nothing can be recorded, so the first failure's time is kept in
   memory; once one can be made again after at least two failed checks, ``DATABASE_UNREACHABLE`` is
   written raised and cleared at once with the window, naming the worker tasks that failed on the
   database meanwhile (the worker notes them in Redis: ``record_failed_task``). Several web processes
   seeing one outage write one alert (under an advisory lock, overlapping windows are merged);
2. asks the broker (Redis) to answer: two failed checks in a row raise ``BROKER_UNREACHABLE`` from the
   first; the next answer clears it, the window added to its message;
3. reads the worker's and beat's stamps (``Installation.worker_seen_at``, ``beat_seen_at``):
   ``WORKER_MISSING`` / ``BEAT_MISSING`` past ``MODELFORGE_WORKER_MISSING_AFTER`` /
   ``MODELFORGE_BEAT_MISSING_AFTER``, silence counted only over time this process was watching (a web
   process started a minute ago does not judge an hour it did not see); cleared when the stamp is fresh.
   With both present, the stamp of the worker's last completed notification pass
   (``Installation.notify_passed_at``): ``NOTIFY_STALLED`` past ``notify_stalled_after()``, naming the
   pass's last recorded crash (a crashing pass cannot deliver the alert about itself);
4. sends the worker a probe task (three times per limit, at most once a minute, across all web
   processes: claimed in Redis),
   so that the worker's stamp does not depend on beat: with beat gone, the worker is not missing;
5. delivers alert notifications itself while the broker, the worker or beat is away (the worker's
   ``alerts.notify``, sent by beat through the broker, is what is missing).

Each check is a function of ``now`` that a test calls directly.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import redis
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.utils import InterfaceError, OperationalError
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert, dedup_key_for
from apps.core.models import Installation
from modelforge.errors import codes
from modelforge.probes import Probe, probe_broker, probe_database_connection, redis_client

logger = logging.getLogger(__name__)

BROKER_UNREACHABLE = codes.BROKER_UNREACHABLE
DATABASE_UNREACHABLE = codes.DATABASE_UNREACHABLE
WORKER_MISSING = "WORKER_MISSING"
BEAT_MISSING = "BEAT_MISSING"
NOTIFY_STALLED = "NOTIFY_STALLED"

SUBJECT_TYPE = "platform"
SUBJECTS = {
    BROKER_UNREACHABLE: ("broker", "broker (Redis)"),
    DATABASE_UNREACHABLE: ("database", "database (PostgreSQL)"),
    WORKER_MISSING: ("worker", "Celery worker"),
    BEAT_MISSING: ("beat", "Celery beat"),
    NOTIFY_STALLED: ("notify", "alert notifications (alerts.notify)"),
}
OUTAGE_CODES = tuple(SUBJECTS)
# While one of these is open the worker does not deliver notifications (it gets no task, or its pass does not
# complete), so the web does.
DELIVERY_AWAY = (BROKER_UNREACHABLE, WORKER_MISSING, BEAT_MISSING, NOTIFY_STALLED)

# One failed check can be a blip (a 2 s timeout under load); two in a row are an outage.
FAILED_CHECKS_FOR_OUTAGE = 2
WORKER_PROBE_KEY = "modelforge:outages:worker-probe"
FAILED_TASKS_KEY = "modelforge:outages:database-failed-tasks"
FAILED_TASKS_KEEP = 1000
FAILED_TASKS_TTL_S = 7 * 86400
FAILED_TASKS_NAMED = 10


def worker_probe_s() -> int:
    """How often the worker is probed: three times per limit, at most once a minute."""
    return max(1, min(60, settings.WORKER_MISSING_AFTER // 3))


def beat_stamp_s() -> int:
    """How often beat stamps: three times per limit, at most every 15 s."""
    return max(1, min(15, settings.BEAT_MISSING_AFTER // 3))


def notify_stalled_after() -> int:
    """How long the worker may go without completing a notification pass: four rounds, at least 2 min."""
    return max(120, 4 * settings.NOTIFY_INTERVAL)


def _key(code: str) -> str:
    return dedup_key_for(code, SUBJECT_TYPE, SUBJECTS[code][0])


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(delta: timedelta) -> int:
    return round(delta.total_seconds())


def _open(code: str) -> Alert | None:
    return Alert.objects.open().filter(dedup_key=_key(code)).first()


def _raise(code: str, message: str, at: datetime) -> bool:
    subject_id, subject_name = SUBJECTS[code]
    return Alert.objects.raise_alert(
        code, Severity.CRITICAL, SUBJECT_TYPE, subject_id, subject_name, message, at
    )


def _clear(alert: Alert, now: datetime, sentence: str) -> bool:
    """Clear ``alert``, keeping what it said when raised and adding how it ended (compare-and-swap: when
    two web processes clear it at once, one does)."""
    cleared = Alert.objects.filter(pk=alert.pk, cleared_at__isnull=True).update(
        cleared_at=now, message=f"{alert.message} {sentence}"
    )
    return cleared == 1


# --- WORKER_MISSING and BEAT_MISSING: stamps too old ---------------------------------------------------


def check_worker(now: datetime, watching_since: datetime) -> str:
    """``ok``, ``waiting`` (stale, but not watched for the limit yet), ``raised``, ``missing`` (already
    open) or ``cleared``."""
    installation = Installation.objects.current()
    return _check_stamp(
        WORKER_MISSING,
        installation.worker_seen_at,
        installation.worker_seen_hostname,
        settings.WORKER_MISSING_AFTER,
        now,
        watching_since,
    )


def check_beat(now: datetime, watching_since: datetime) -> str:
    """As ``check_worker``, for beat's scheduler stamp."""
    installation = Installation.objects.current()
    return _check_stamp(
        BEAT_MISSING,
        installation.beat_seen_at,
        installation.beat_seen_hostname,
        settings.BEAT_MISSING_AFTER,
        now,
        watching_since,
    )


def check_notify(now: datetime, watching_since: datetime) -> str:
    """As ``check_worker``, for the worker's notification passes. Judged only while the worker and beat
    are both seen within their limits and the broker answers: otherwise ``away``, since WORKER_MISSING,
    BEAT_MISSING or BROKER_UNREACHABLE names the cause (and the web processes deliver meanwhile)."""
    installation = Installation.objects.current()

    def fresh(seen: datetime | None, limit: int) -> bool:
        return seen is not None and (now - seen).total_seconds() <= limit

    present = (
        fresh(installation.worker_seen_at, settings.WORKER_MISSING_AFTER)
        and fresh(installation.beat_seen_at, settings.BEAT_MISSING_AFTER)
        and _open(BROKER_UNREACHABLE) is None
    )
    if not present and _open(NOTIFY_STALLED) is None:
        return "away"
    return _check_stamp(
        NOTIFY_STALLED, installation.notify_passed_at, "", notify_stalled_after(), now, watching_since
    )


def _check_stamp(
    code: str, seen: datetime | None, host: str, limit: int, now: datetime, watching_since: datetime
) -> str:
    if seen is not None and (now - seen).total_seconds() <= limit:
        alert = _open(code)
        if alert is not None and _clear(alert, now, _back(code, host, seen)):
            logger.warning("%s cleared: %s", code, _back(code, host, seen))
            return "cleared"
        return "ok"
    # Silence is counted only over time this process watched: after a restart of the web processes it
    # does not judge time it did not see (the listening clock's rule, apps/nodes/listening.py).
    # Nor time the books did not see: a restore's switch-over brings back stamps as old as the backup
    # (the listening clock's listening_since moves to the switch-over), which is not the process's silence.
    listening_since = _listening_since()
    watched_from = max(watching_since, listening_since) if listening_since is not None else watching_since
    silent_from = max(seen, watched_from) if seen is not None else watched_from
    if (now - silent_from).total_seconds() <= limit:
        return "waiting"
    if _open(code) is not None:
        return "missing"
    message = _missing(code, seen, now, watching_since, limit)
    if not _raise(code, message, now):
        return "missing"
    logger.error("%s raised: %s", code, message)
    return "raised"


# Since when the control plane has been listening, from the apps that keep that clock (apps.nodes adds
# ``listening.listening_since`` at its ready(): moved by a restart of every web process and by a restore's
# switch-over). Alerts sits below nodes, so it asks through this list; the latest answer counts.
LISTENING_SINCE: list[Callable[[], datetime | None]] = []


def _listening_since() -> datetime | None:
    answers = [since for since in (source() for source in LISTENING_SINCE) if since is not None]
    return max(answers) if answers else None


def _missing(code: str, seen: datetime | None, now: datetime, watching_since: datetime, limit: int) -> str:
    if code == NOTIFY_STALLED:
        return _notify_stalled(seen, now, watching_since, limit)
    if code == WORKER_MISSING:
        silence = (
            f"No Celery worker has run a task since {_when(seen)} ({_seconds(now - seen)} s ago"
            if seen is not None
            else f"No Celery worker has ever run a task here (watched for {_seconds(now - watching_since)} s"
        )
        return (
            f"{silence}; the limit is MODELFORGE_WORKER_MISSING_AFTER = {limit} s). Background work is not "
            "running: liveness sweeps, server starts and stops, replication, backups (the web processes "
            "deliver alert notifications meanwhile). Check that a worker runs (celery -A modelforge worker), "
            "its log, and that it reaches Redis and PostgreSQL (with BROKER_UNREACHABLE open, fix the "
            "broker first). This clears when a worker runs a task again."
        )
    silence = (
        f"Celery beat has not ticked since {_when(seen)} ({_seconds(now - seen)} s ago"
        if seen is not None
        else f"Celery beat has never ticked here (watched for {_seconds(now - watching_since)} s"
    )
    return (
        f"{silence}; the limit is MODELFORGE_BEAT_MISSING_AFTER = {limit} s). Nothing scheduled is sent: "
        "liveness sweeps, reconcile and recovery, the work watchdog, backups, alert notifications (the web "
        "processes deliver these meanwhile). Check that one beat runs "
        "(celery -A modelforge beat -S modelforge.beat:Scheduler) and its log; it needs PostgreSQL and "
        "Redis. This clears when beat ticks again."
    )


def _notify_stalled(seen: datetime | None, now: datetime, watching_since: datetime, limit: int) -> str:
    installation = Installation.objects.current()
    silence = (
        f"The worker has not completed a pass of alert notifications (alerts.notify) since {_when(seen)} "
        f"({_seconds(now - seen)} s ago"
        if seen is not None
        else "The worker has never completed a pass of alert notifications (alerts.notify) here (watched "
        f"for {_seconds(now - watching_since)} s"
    )
    crashed = installation.notify_crashed_at
    why = (
        f"Its last pass crashed at {_when(crashed)} ({installation.notify_crash[:500]})."
        if crashed is not None and (seen is None or crashed > seen)
        else "No crash was recorded: look for the task in the worker's log (queued behind others, or hung)."
    )
    return (
        f"{silence}; the limit is {limit} s). {why} Until a pass completes the web processes deliver alert "
        "notifications themselves; if what stops the worker's pass stops theirs too, nothing is sent and "
        "the dashboard is where this shows. See TROUBLESHOOTING.md, NOTIFY_STALLED. This clears when the "
        "worker completes a pass again."
    )


def _back(code: str, host: str, seen: datetime) -> str:
    if code == NOTIFY_STALLED:
        return f"Cleared: the worker completed a pass of alert notifications at {_when(seen)}."
    if code == WORKER_MISSING:
        return f"Cleared: a worker on {host or 'an unnamed host'} ran a task at {_when(seen)}."
    return f"Cleared: beat on {host or 'an unnamed host'} ticked again at {_when(seen)}."


def record_beat_seen(hostname: str, at: datetime | None = None) -> None:
    """Beat's scheduler is ticking (called from ``modelforge.beat.Scheduler.tick``)."""
    Installation.objects.current().record_beat_seen(hostname, at)


def send_worker_probe() -> bool:
    """Send ``core.record_worker_seen`` unless a web process did within ``worker_probe_s()`` (claimed in
    Redis, so several web processes send one probe per round)."""
    every = worker_probe_s()
    try:
        if not redis_client().set(WORKER_PROBE_KEY, "1", nx=True, ex=every):
            return False
        from apps.core.tasks import record_worker_seen

        # A probe that waited longer than two rounds in the queue says nothing new: dropped unrun.
        record_worker_seen.apply_async(expires=2 * every, retry=False)
    except Exception as exc:  # the broker went away between its check and the send; the next round retries
        logger.warning("worker probe not sent (%s)", type(exc).__name__)
        return False
    return True


# --- DATABASE_UNREACHABLE: recorded when it answers again ------------------------------------------------


def is_database_error(exc: BaseException | None) -> bool:
    """The database could not be reached or dropped the session (not a task's own bad query)."""
    return isinstance(
        exc, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError
    )


def record_failed_task(
    task_name: str, task_id: str, exc: BaseException | None, at: datetime | None = None
) -> bool:
    """Note in Redis a worker task that failed on the database, for the DATABASE_UNREACHABLE written when
    the database answers again (the worker's ``task_failure`` signal, modelforge/celery.py)."""
    if not is_database_error(exc):
        return False
    entry = json.dumps(
        {
            "task": task_name,
            "id": task_id,
            "at": (at or timezone.now()).isoformat(),
            "error": type(exc).__name__,
        }
    )
    try:
        pipe = redis_client().pipeline()
        pipe.lpush(FAILED_TASKS_KEY, entry)
        pipe.ltrim(FAILED_TASKS_KEY, 0, FAILED_TASKS_KEEP - 1)
        pipe.expire(FAILED_TASKS_KEY, FAILED_TASKS_TTL_S)
        pipe.execute()
    except redis.RedisError as error:
        logger.warning(
            "task %s %s failed on the database; not noted, Redis did not answer (%s)",
            task_name,
            task_id,
            type(error).__name__,
        )
        return False
    logger.warning(
        "task %s %s failed on the database (%s): noted for DATABASE_UNREACHABLE",
        task_name,
        task_id,
        type(exc).__name__,
    )
    return True


def failed_tasks_between(start: datetime, end: datetime) -> list[str] | None:
    """Names of the worker tasks noted as failed on the database in ``[start, end]``; ``None`` when Redis
    does not answer (then nobody knows)."""
    try:
        raw = redis_client().lrange(FAILED_TASKS_KEY, 0, -1)
    except redis.RedisError:
        return None
    names = []
    for item in raw:
        try:
            entry = json.loads(item)
            at = datetime.fromisoformat(entry["at"])
        except (ValueError, KeyError, TypeError):
            continue
        if start <= at <= end:
            names.append(str(entry["task"]))
    return names


def record_database_outage(start: datetime, end: datetime, observer: str) -> Alert:
    """``DATABASE_UNREACHABLE`` raised at ``start`` and cleared at ``end``; merged with the one another
    web process already wrote for the same outage."""
    interval = timedelta(seconds=settings.OUTAGE_CHECK_INTERVAL)
    key = _key(DATABASE_UNREACHABLE)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [key])
        # Processes check at different moments: windows within two intervals of each other are one.
        alert = (
            Alert.objects.filter(
                dedup_key=key, raised_at__lte=end + 2 * interval, cleared_at__gte=start - 2 * interval
            )
            .order_by("raised_at")
            .first()
        )
        if alert is not None and alert.cleared_at is not None:
            start, end = min(start, alert.raised_at), max(end, alert.cleared_at)
        # The outage may have begun up to one interval before the first failed check.
        message = _database_message(start, end, failed_tasks_between(start - interval, end))
        if alert is None:
            subject_id, subject_name = SUBJECTS[DATABASE_UNREACHABLE]
            alert = Alert.objects.create(
                code=DATABASE_UNREACHABLE,
                severity=Severity.CRITICAL,
                subject_type=SUBJECT_TYPE,
                subject_id=subject_id,
                subject_name=subject_name,
                dedup_key=key,
                message=message,
                raised_at=start,
                last_raised_at=end,
                cleared_at=end,
            )
        else:
            alert.raised_at, alert.last_raised_at, alert.cleared_at, alert.message = start, end, end, message
            alert.save(update_fields=["raised_at", "last_raised_at", "cleared_at", "message"])
    logger.error(
        "DATABASE_UNREACHABLE recorded (alert %s, seen by %s): %s", alert.pk, observer, alert.message
    )
    return alert


def _database_message(start: datetime, end: datetime, failed: list[str] | None) -> str:
    if failed is None:
        tasks = "Which worker tasks failed meanwhile is not known: Redis did not answer either."
    elif not failed:
        tasks = "No worker task failed on the database meanwhile."
    else:
        counted = Counter(failed).most_common()
        named = ", ".join(f"{name}: {n}" for name, n in counted[:FAILED_TASKS_NAMED])
        more = (
            f" and {len(counted) - FAILED_TASKS_NAMED} more kinds"
            if len(counted) > FAILED_TASKS_NAMED
            else ""
        )
        tasks = f"Worker tasks that failed on the database meanwhile: {len(failed)} ({named}{more})."
    return (
        f"The database (PostgreSQL) did not accept a new connection from {_when(start)} to {_when(end)} "
        f"({_seconds(end - start)} s), as the web processes saw it (they check every "
        f"{settings.OUTAGE_CHECK_INTERVAL} s, so it may have begun that much earlier). Nothing could be "
        f"recorded meanwhile: requests that needed the database failed. {tasks} It answers again. Look in "
        "PostgreSQL's log for that window (a restart, max_connections, storage, the network); scheduled "
        "work runs again by itself, and work waiting on a row is sent again by the work watchdog."
    )


def recent_outages(now: datetime | None = None) -> list[Alert]:
    """For the overview: the open outage alerts, then the database outages of the last day (those are
    never open: they are recorded once over)."""
    now = now or timezone.now()
    keys = [_key(code) for code in OUTAGE_CODES]
    open_ = list(Alert.objects.open().filter(dedup_key__in=keys).order_by("raised_at"))
    database = Alert.objects.filter(
        dedup_key=_key(DATABASE_UNREACHABLE), cleared_at__gte=now - timedelta(days=1)
    ).order_by("-raised_at")[:3]
    return open_ + list(database)


# --- one web process's watch -----------------------------------------------------------------------------


@dataclass
class Watch:
    """What one web process has seen of the stores, kept in memory: the database may be what is away."""

    started_at: datetime
    observer: str
    database_failing_since: datetime | None = None
    database_failures: int = 0
    broker_failing_since: datetime | None = None
    broker_failures: int = 0

    def database(self, probe: Probe, now: datetime) -> bool:
        """Count a failed new-connection check; on the first good one after an outage, record it.
        ``True`` when the database answers (the other checks can run)."""
        if not probe.ok:
            if self.database_failures == 0:
                self.database_failing_since = now
                logger.warning(
                    "%s at %s; recorded as DATABASE_UNREACHABLE when it answers again",
                    probe.detail,
                    _when(now),
                )
            self.database_failures += 1
            return False
        since, failures = self.database_failing_since, self.database_failures
        self.database_failing_since, self.database_failures = None, 0
        if since is None:
            return True
        if failures < FAILED_CHECKS_FOR_OUTAGE:
            logger.info("database answered again at %s after one failed check: not an outage", _when(now))
            return True
        try:
            record_database_outage(since, now, self.observer)
        except Exception:
            # Gone again before the record was written: keep the window for the next answer.
            self.database_failing_since, self.database_failures = since, failures
            raise
        return True

    def broker(self, probe: Probe, now: datetime) -> str:
        """``ok``, ``failing`` (one failed check), ``raised``, ``unreachable`` (open already), ``cleared``."""
        if not probe.ok:
            if self.broker_failures == 0:
                self.broker_failing_since = now
            self.broker_failures += 1
            since = self.broker_failing_since or now
            if self.broker_failures < FAILED_CHECKS_FOR_OUTAGE:
                return "failing"
            if _open(BROKER_UNREACHABLE) is not None:
                return "unreachable"
            message = (
                f"The broker (Redis) has not answered since {_when(since)}: {probe.detail}. Nothing reaches "
                "the worker: background work waits and beat's schedule is not sent; serving goes on (each "
                "web process routes on its own table). Check the Redis server and MODELFORGE_REDIS_URL; the "
                "web processes deliver alert notifications meanwhile. This clears when it answers."
            )
            if not _raise(BROKER_UNREACHABLE, message, since):
                return "unreachable"
            logger.error("BROKER_UNREACHABLE raised: %s", message)
            return "raised"
        self.broker_failing_since, self.broker_failures = None, 0
        alert = _open(BROKER_UNREACHABLE)
        if alert is None:
            return "ok"
        sentence = (
            f"Cleared: it answered again at {_when(now)}; unreachable from {_when(alert.raised_at)} to "
            f"{_when(now)} ({_seconds(now - alert.raised_at)} s)."
        )
        if not _clear(alert, now, sentence):
            return "ok"
        logger.warning("BROKER_UNREACHABLE %s", sentence)
        return "cleared"

    def tick(self, now: datetime | None = None) -> dict[str, str]:
        """One round of every check; what each found."""
        now = now or timezone.now()
        if not self.database(probe_database_connection(), now):
            return {"database": "unreachable"}
        broker = probe_broker()
        found = {
            "database": "ok",
            "broker": self.broker(broker, now),
            "worker": check_worker(now, self.started_at),
            "beat": check_beat(now, self.started_at),
            "notify": check_notify(now, self.started_at),
        }
        if broker.ok:
            send_worker_probe()
        changed = any(state in ("raised", "cleared") for state in found.values())
        if changed or Alert.objects.open().filter(dedup_key__in=[_key(c) for c in DELIVERY_AWAY]).exists():
            from apps.alerts import notify

            notify.sweep(now)
        return found


class OutageTicker:
    """The web worker's outage checks, on a daemon thread of its own (the event loop never waits on it)."""

    def __init__(self, interval_s: float | None = None) -> None:
        self.interval_s = float(interval_s or settings.OUTAGE_CHECK_INTERVAL)
        self.watch = Watch(started_at=timezone.now(), observer=f"{socket.gethostname()}:{os.getpid()}")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="modelforge-outages", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.watch.tick()
            except Exception as exc:  # the database gone mid-round: the next round's probe notices
                logger.warning("outage checks not completed: %s", type(exc).__name__)
            finally:
                close_old_connections()
            self.stop.wait(self.interval_s)
