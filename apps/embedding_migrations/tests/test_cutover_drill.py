"""The bad day of a cutover, with real kills: the worker running a stage that touches the store is
killed (SIGKILL) in provisioning, in reindexing and in cutting over. Each time the cutover stays in its
stage, the watch marks it interrupted and raises CUTOVER_INTERRUPTED, a restarted worker (and the same
run delivered again) does not move it, the alias never points at a half-built target, and an operator's
action on the admin's review page resolves it, recorded with who and why.

The drill's worker consumes a queue of its own (MODELFORGE_CUTOVER_QUEUE), so the session's worker
never takes its runs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.test import Client
from psycopg import sql

from apps.alerts.models import Alert
from apps.clusters.models import Capability
from apps.embedding_migrations import engine
from apps.embedding_migrations.models import Cutover
from apps.embedding_migrations.tasks import run_cutover
from apps.embedding_migrations.tests.live import Fleet, build_fleet, start_agent, stop_agent
from apps.embedding_migrations.tests.stores import scratch_vector_dsn
from modelforge.celery import app
from tests.fixtures import PYTHON, RunningProcess, database_url, process_env, start_process, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

QUEUE = f"cutover-drill-{os.getpid()}"


@pytest.fixture
def fleet(live_web, celery_worker_process, operator_client, tmp_path: Path) -> Iterator[Fleet]:
    agent = start_agent(live_web, tmp_path)
    try:
        with scratch_vector_dsn() as dsn:
            built = build_fleet(operator_client, agent, dsn, documents=1200)
            yield built
            built.adapter.close()
    finally:
        stop_agent(agent)


class DrillWorker:
    """A real Celery worker on the drill's queue, killed and started again at will."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.count = 0
        self.running: RunningProcess | None = None

    def start(self) -> None:
        self.count += 1
        hostname = f"drill-{os.getpid()}-{self.count}@%h"
        self.running = start_process(
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "modelforge",
                "worker",
                "-Q",
                QUEUE,
                "--pool",
                "solo",
                "--without-mingle",
                "--without-gossip",
                "--hostname",
                hostname,
                "-l",
                "INFO",
            ],
            process_env(MODELFORGE_DATABASE_URL=database_url(), MODELFORGE_LOG_LEVEL="INFO"),
            self.tmp_path / f"drill-worker-{self.count}.log",
        )
        name = hostname.replace("%h", os.uname().nodename)
        assert wait_until(lambda: bool(app.control.ping([name], timeout=0.5)), 60, interval=0.5), self.log()

    def kill(self) -> None:
        assert self.running is not None
        os.killpg(self.running.process.pid, signal.SIGKILL)
        self.running.process.wait(10)

    def stop(self) -> None:
        if self.running is not None and self.running.process.poll() is None:
            self.running.stop()

    def log(self) -> str:
        return self.running.log()[-3000:] if self.running else ""


@pytest.fixture
def drill_worker(settings, tmp_path: Path) -> Iterator[DrillWorker]:
    settings.CUTOVER_QUEUE = QUEUE
    worker = DrillWorker(tmp_path)
    worker.start()
    yield worker
    worker.stop()


class StoreLock:
    """An ACCESS EXCLUSIVE lock on a table or view of the store, held by another session: the stage's
    next statement on it waits, so the worker is killed while it is in the store."""

    def __init__(self, dsn: str, relation: str) -> None:
        self.conn = psycopg.connect(dsn)
        self.conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(relation)))

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def claimed(pk: Any) -> bool:
    return Cutover.objects.filter(pk=pk, claimed_at__isnull=False).exists()


def interrupted_by_the_watch(settings, pk: Any) -> Cutover:
    settings.CUTOVER_STALL_AFTER = 2
    assert wait_until(lambda: engine.watch()["interrupted"] == 1, 15)
    cutover = Cutover.objects.get(pk=pk)
    assert cutover.interrupted
    alert = Alert.objects.open().get(code="CUTOVER_INTERRUPTED", subject_id=str(pk))
    assert alert.severity == "critical" and cutover.stage in alert.message
    return cutover


def restart_does_not_move_it(worker: DrillWorker, cutover: Cutover) -> None:
    """A restarted worker, and the same run delivered to it again (as the broker would), change nothing."""
    worker.start()
    run_cutover.apply_async((str(cutover.pk), str(cutover.run_token)), queue=QUEUE)
    time.sleep(3)
    engine.watch()
    after = Cutover.objects.get(pk=cutover.pk)
    assert (after.stage, after.docs_done, after.interrupted_at) == (
        cutover.stage,
        cutover.docs_done,
        cutover.interrupted_at,
    )
    assert after.events.count() == cutover.events.count()


def review(staff: Client, pk: Any, action: str, reason: str) -> str:
    url = f"/admin/embedding_migrations/cutover/{pk}/review/"
    page = staff.get(url)
    assert page.status_code == 200
    answer = staff.post(url, {"action": action, "reason": reason}, follow=True)
    assert answer.status_code == 200
    return answer.content.decode()


def test_a_worker_killed_in_each_stage_that_touches_the_store_leaves_the_cutover_for_an_operator(
    fleet: Fleet, drill_worker: DrillWorker, operator_client, settings
):
    dsn = fleet.store.dsn
    admin = User.objects.create_superuser("drill-admin", "drill@example.com", "a-long-drill-password")
    staff = Client()
    staff.force_login(admin)

    def alias_target() -> str | None:
        target = fleet.adapter.read_alias_target("kb")
        assert target is not None
        return target

    def plan(batch_size: int) -> Cutover:
        planned = operator_client.post(
            "/api/v1/cutovers",
            {"alias": fleet.alias.pk, "target_capability": "rag.embedding@2", "batch_size": batch_size},
            format="json",
        )
        assert planned.status_code == 201, planned.content
        return Cutover.objects.get(pk=planned.json()["id"])

    # 1. Killed in provisioning (creating the target index).
    first = plan(64)
    lock = StoreLock(dsn, "modelforge_indexes")
    try:
        assert (
            operator_client.post(f"/api/v1/cutovers/{first.pk}/start", {}, format="json").status_code == 202
        )
        assert wait_until(lambda: claimed(first.pk), 30), drill_worker.log()
        time.sleep(0.5)
        drill_worker.kill()
    finally:
        lock.release()
    stuck = interrupted_by_the_watch(settings, first.pk)
    assert stuck.stage == "provisioning" and alias_target() == "kb_v1"
    restart_does_not_move_it(drill_worker, stuck)
    page = staff.get(f"/admin/embedding_migrations/cutover/{first.pk}/review/").content.decode()
    assert "provisioning" in page and "interrupted" in page and "kb_v1" in page
    review(staff, first.pk, "retry", "drill: provisioning was interrupted, retry is safe")
    assert wait_until(lambda: Cutover.objects.get(pk=first.pk).stage == "ready_to_cut", 90), (
        drill_worker.log()
    )
    retried = Cutover.objects.get(pk=first.pk).events.get(reason__startswith="drill: provisioning")
    assert retried.actor == "drill-admin" and (retried.from_stage, retried.to_stage) == (
        "provisioning",
        "provisioning",
    )
    assert not Alert.objects.open().filter(code="CUTOVER_INTERRUPTED").exists()
    assert alias_target() == "kb_v1"
    rolled = operator_client.post(
        f"/api/v1/cutovers/{first.pk}/roll-back", {"reason": "drill: next scenario"}, format="json"
    )
    assert rolled.status_code == 200 and rolled.json()["stage"] == "rolled_back"

    # 2. Killed in reindexing (writing a batch into the target).
    second = plan(20)
    assert operator_client.post(f"/api/v1/cutovers/{second.pk}/start", {}, format="json").status_code == 202
    assert wait_until(lambda: Cutover.objects.get(pk=second.pk).docs_done >= 100, 60), drill_worker.log()
    lock = StoreLock(dsn, second.target_index)
    try:
        time.sleep(1.0)
        drill_worker.kill()
    finally:
        lock.release()
    stuck = interrupted_by_the_watch(settings, second.pk)
    assert stuck.stage == "reindexing" and 100 <= stuck.docs_done < fleet.documents
    assert alias_target() == "kb_v1"
    restart_does_not_move_it(drill_worker, stuck)
    retry = operator_client.post(
        f"/api/v1/cutovers/{second.pk}/retry", {"reason": "drill: resume the reindex"}, format="json"
    )
    assert retry.status_code == 202, retry.content
    assert wait_until(lambda: Cutover.objects.get(pk=second.pk).stage == "ready_to_cut", 90), (
        drill_worker.log()
    )
    resumed = Cutover.objects.get(pk=second.pk)
    assert resumed.docs_done == resumed.docs_total == fleet.documents  # resumed from its cursor
    assert resumed.verification["passed"] and alias_target() == "kb_v1"

    # 3. Killed in cutting over (swapping the alias).
    lock = StoreLock(dsn, "kb")
    try:
        assert operator_client.post(f"/api/v1/cutovers/{second.pk}/cut", {}, format="json").status_code == 202
        assert wait_until(lambda: claimed(second.pk), 30), drill_worker.log()
        time.sleep(0.5)
        drill_worker.kill()
    finally:
        lock.release()
    stuck = interrupted_by_the_watch(settings, second.pk)
    assert stuck.stage == "cutting_over" and alias_target() == "kb_v1"  # the swap never committed
    restart_does_not_move_it(drill_worker, stuck)
    # Complete is refused while the store shows the alias on the source.
    refused = review(staff, second.pk, "complete", "drill: try to complete")
    assert "ALIAS_NOT_ON_TARGET" in refused
    assert Cutover.objects.get(pk=second.pk).stage == "cutting_over"
    review(staff, second.pk, "retry", "drill: the store shows the source, swap again")
    assert wait_until(lambda: Cutover.objects.get(pk=second.pk).stage == "completed", 30), drill_worker.log()
    assert alias_target() == second.target_index
    fleet.alias.refresh_from_db()
    assert fleet.alias.capability.name == "rag.embedding@2"
    assert str(Capability.objects.get(name="kb.query@1").follows) == "rag.embedding@2"
    assert not Alert.objects.open().filter(subject_type="cutover").exists()
