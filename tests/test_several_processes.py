"""Several beats and several workers acting as one (issue 19, item 4), with real processes.

- Two beats: one holds the leader lock and schedules, the other waits as a standby; the leader killed with
  SIGKILL, the standby schedules within ``MODELFORGE_BEAT_STANDBY_RETRY_S`` (plus start-up slack), and no
  period of the entry is sent twice across the two. A leader whose lock session is ended under it steps
  down before its next tick.
- Two workers: the one running a backup killed with SIGKILL mid-dump; the backup fails closed once
  (``MANIFEST_INCOMPLETE``, swept by the surviving worker), and the same task delivered again does nothing.

Each group runs on a Redis database of its own so that the session's worker never takes its messages.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import redis
from celery import Celery
from django.conf import settings
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from apps.backups import codes, snapshot
from apps.backups.models import Backup, BackupState
from modelforge.beat import CLAIM_PREFIX, ROLE_PREFIX, claim_period
from tests.fixtures import PYTHON, RunningProcess, database_url, process_env, start_process, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

DRILL_TASK = "tests.beat_drill"  # never run: the beats' messages are counted in the queue
PERIOD_S = 2
RETRY_S = 2
# The standby notices within RETRY_S; a tick after that it sends what is due.
TAKEOVER_BOUND_S = RETRY_S + 4


def broker_url(db: int) -> str:
    return re.sub(r"/\d*$", "", settings.CELERY_BROKER_URL.rstrip("/")) + f"/{db}"


@pytest.fixture
def own_redis(request: pytest.FixtureRequest) -> Iterator[tuple[str, redis.Redis]]:
    db = 13 if "beat" in request.node.name else 14
    url = broker_url(db)
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.flushdb()


def kill(process: RunningProcess) -> None:
    if process.process.poll() is None:
        os.killpg(process.process.pid, signal.SIGKILL)
        process.process.wait(10)


STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
EVENT = re.compile(STAMP + r".*(Scheduler: Sending due task beat-drill |beat: beat-drill not sent)", re.M)


def sends(log: str) -> list[datetime]:
    """When beat-drill was sent: celery logs "Sending due task" before the claim, so a send followed by
    the claim's "not sent" is no send."""
    sent: list[datetime] = []
    for stamp, event in EVENT.findall(log):
        if event.startswith("beat:"):
            sent.pop()
        else:
            sent.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f"))
    return sent


def queued(client: redis.Redis, task: str) -> int:
    return sum(1 for raw in client.lrange("celery", 0, -1) if json.loads(raw)["headers"]["task"] == task)


def test_two_beats_one_leads_the_standby_takes_over_and_no_period_is_sent_twice(
    own_redis: tuple[str, redis.Redis], tmp_path: Path
):
    url, client = own_redis
    every, _ = IntervalSchedule.objects.get_or_create(every=PERIOD_S, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="beat-drill", task=DRILL_TASK, interval=every)
    env = process_env(
        MODELFORGE_DATABASE_URL=database_url(),
        MODELFORGE_REDIS_URL=url,
        MODELFORGE_BEAT_STANDBY_RETRY_S=str(RETRY_S),
        MODELFORGE_LOG_LEVEL="INFO",
    )
    argv = [PYTHON, "-m", "celery", "-A", "modelforge", "beat", "-l", "INFO", "--pidfile="]
    first = start_process(argv, env, tmp_path / "first.log")
    second: RunningProcess | None = None
    try:
        assert wait_until(lambda: "beat leader on" in first.log(), 60), first.log()[-3000:]
        second = start_process(argv, env, tmp_path / "second.log")
        assert wait_until(lambda: "beat standby on" in second.log(), 60), second.log()[-3000:]
        # Both run; only the leader sends.
        assert wait_until(lambda: len(sends(first.log())) >= 3, 30), first.log()[-3000:]
        assert sends(second.log()) == []
        assert "beat leader on" not in second.log()
        roles = sorted(cast(bytes, client.get(key)).decode() for key in client.scan_iter(ROLE_PREFIX + "*"))
        assert roles == ["leader", "standby"], roles

        kill(first)
        killed_at = datetime.now()
        assert wait_until(lambda: len(sends(second.log())) >= 2, TAKEOVER_BOUND_S + PERIOD_S + 5), (
            second.log()[-3000:]
        )
        first_sends, second_sends = sends(first.log()), sends(second.log())
        assert "beat leader on" in second.log()
        takeover_s = (second_sends[0] - killed_at).total_seconds()
        assert takeover_s <= TAKEOVER_BOUND_S, (takeover_s, second.log()[-3000:])

        # No period twice: every send at least 90 % of a period after the one before, across both beats,
        # and every send is one message in the queue (skipped claims are never sent).
        timeline = sorted(first_sends + second_sends)
        gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(timeline)]
        assert min(gaps) >= PERIOD_S * 0.9 - 0.05, (gaps, timeline)
        # Beat logs a send before it publishes it: killed in between, the leader's last logged send never
        # reached the queue (and its period is not sent again: the standby skips a claimed period). Every
        # other send is exactly one message, and no message is there that no beat logged.
        in_queue = queued(client, DRILL_TASK)
        assert in_queue in (len(timeline), len(timeline) - 1), (in_queue, timeline)
        print(f"takeover {takeover_s:.2f} s after SIGKILL; sends {len(timeline)}, gaps {gaps}")
    finally:
        kill(first)
        if second is not None:
            second.stop()


def test_a_leader_whose_lock_session_is_ended_stops_scheduling_and_takes_the_lock_again(
    own_redis: tuple[str, redis.Redis], tmp_path: Path
):
    url, _ = own_redis
    env = process_env(
        MODELFORGE_DATABASE_URL=database_url(),
        MODELFORGE_REDIS_URL=url,
        MODELFORGE_BEAT_STANDBY_RETRY_S=str(RETRY_S),
        MODELFORGE_LOG_LEVEL="INFO",
    )
    argv = [PYTHON, "-m", "celery", "-A", "modelforge", "beat", "-l", "INFO", "--pidfile="]
    only = start_process(argv, env, tmp_path / "only.log")
    try:
        assert wait_until(lambda: "beat leader on" in only.log(), 60), only.log()[-3000:]
        with psycopg.connect(database_url(), autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'modelforge-beat-leader' AND datname = current_database()"
            ).fetchall()
        assert ended == [(True,)]
        # It notices before its next tick, stops leading, and tries the (now free) lock again at once.
        assert wait_until(lambda: "lock's session failed" in only.log(), RETRY_S + 5), only.log()[-3000:]
        assert wait_until(lambda: only.log().count("beat leader on") == 2, 2 * RETRY_S + 5), only.log()[-999:]
        assert only.process.poll() is None
    finally:
        only.stop()


def test_a_period_is_claimed_once_however_many_beats_ask(own_redis: tuple[str, redis.Redis]):
    _, client = own_redis
    assert claim_period(client, "drill", 60) is True
    assert claim_period(client, "drill", 60) is False  # a second beat, or a takeover within the period
    assert 0 < int(client.pttl(CLAIM_PREFIX + "drill")) <= 54_000
    assert claim_period(client, "other", 60) is True


TAKE = "Task backups.take_backup["  # received, then succeeded: one delivery


def worker(env: dict[str, str], name: str, log: Path) -> RunningProcess:
    argv = [PYTHON, "-m", "celery", "-A", "modelforge", "worker", "-l", "INFO", "--pool", "solo"]
    argv += ["--without-mingle", "--without-gossip", "--hostname", f"{name}-{os.getpid()}@%h"]
    return start_process(argv, env, log)


def test_two_workers_the_one_running_a_backup_killed_the_backup_fails_closed_once(
    own_redis: tuple[str, redis.Redis], tmp_path: Path
):
    url, _ = own_redis
    Path(settings.BACKUP_ROOT).mkdir(parents=True, exist_ok=True)
    env = process_env(
        MODELFORGE_DATABASE_URL=database_url(), MODELFORGE_REDIS_URL=url, MODELFORGE_LOG_LEVEL="INFO"
    )
    workers = {name: worker(env, name, tmp_path / f"{name}.log") for name in ("one", "two")}
    # Not the current app: shared tasks sent later in this test session must go to the session broker.
    client = Celery("several-processes", broker=url, set_as_current=False)
    holder: psycopg.Connection[Any] | None = None
    try:
        assert wait_until(lambda: len(client.control.ping(timeout=0.5)) == 2, 60), {
            name: w.log()[-2000:] for name, w in workers.items()
        }
        # pg_dump waits behind this lock: the backup is caught mid-dump, deterministically.
        holder = psycopg.connect(database_url())
        holder.execute("LOCK TABLE django_session IN ACCESS EXCLUSIVE MODE")
        backup = snapshot.request_backup(trigger="operator", by="drill")
        client.send_task("backups.take_backup", args=[backup.pk])

        def dumping() -> bool:
            return Backup.objects.filter(pk=backup.pk, state=BackupState.RUNNING, phase="dumping").exists()

        assert wait_until(dumping, 60), {name: w.log()[-2000:] for name, w in workers.items()}
        [victim] = [name for name, w in workers.items() if TAKE in w.log()]
        survivor = "two" if victim == "one" else "one"
        kill(workers[victim])
        holder.rollback()

        # The survivor's housekeeping finds the backup's liveness lock free: failed, once, closed.
        client.send_task("backups.housekeeping")

        def failed() -> bool:
            return Backup.objects.get(pk=backup.pk).state == BackupState.FAILED

        assert wait_until(failed, 60), workers[survivor].log()[-3000:]
        swept = Backup.objects.get(pk=backup.pk)
        assert swept.reason_code == codes.MANIFEST_INCOMPLETE
        assert not swept.directory or not Path(swept.directory).exists()

        # The same task delivered again (a redelivery) finds the backup no longer queued: nothing happens.
        client.send_task("backups.take_backup", args=[backup.pk])

        def redelivered_done() -> str:
            log = workers[survivor].log()
            return log.split(TAKE)[-1] if log.count(TAKE) >= 2 else ""

        assert wait_until(lambda: "succeeded" in redelivered_done(), 30), workers[survivor].log()[-3000:]
        assert "'skipped'" in redelivered_done()
        assert Backup.objects.count() == 1
        after = Backup.objects.get(pk=backup.pk)
        assert (after.state, after.reason_code, after.finished_at) == (
            BackupState.FAILED,
            codes.MANIFEST_INCOMPLETE,
            swept.finished_at,
        )
    finally:
        if holder is not None:
            holder.close()
        for running in workers.values():
            kill(running)
