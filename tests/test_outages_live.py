"""Outages for real: a throw-away PostgreSQL and Redis of this module's own, a real gunicorn web process
on them, and real Celery worker and beat processes, stopped, frozen and killed (issue 13: outages were
silent, and /readyz answered ready while no new database connection could be made).

The shared test servers are never touched; everything here runs on servers started for this module."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from apps.alerts import outages
from modelforge.embedded import EmbeddedPostgres, EmbeddedRedis
from tests.fixtures import (
    PYTHON,
    LiveWeb,
    RunningProcess,
    free_port,
    http_ok,
    process_env,
    run_command,
    start_process,
    wait_until,
)

pytestmark = pytest.mark.stack

# Short limits so that real processes can be seen missing within seconds.
LIMIT_S = 10


@dataclass
class Stores:
    postgres: EmbeddedPostgres
    redis: EmbeddedRedis

    def env(self, **overrides: str) -> dict[str, str]:
        return process_env(
            MODELFORGE_DATABASE_URL=self.postgres.url,
            MODELFORGE_REDIS_URL=self.redis.url,
            MODELFORGE_LOG_LEVEL="INFO",
            MODELFORGE_OUTAGE_CHECK_INTERVAL="1",
            MODELFORGE_WORKER_MISSING_AFTER=str(LIMIT_S),
            MODELFORGE_BEAT_MISSING_AFTER=str(LIMIT_S),
            **overrides,
        )

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.postgres.url, autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params or [])
            return cursor.fetchall() if cursor.description else []

    def alerts(self, code: str) -> list[tuple[Any, ...]]:
        """(id, raised_at, cleared_at, message, severity) of every ``code`` alert, oldest first."""
        return self.query(
            "SELECT id, raised_at, cleared_at, message, severity FROM alerts_alert WHERE code = %s "
            "ORDER BY raised_at, id",
            [code],
        )

    def open_alerts(self, code: str) -> list[tuple[Any, ...]]:
        return [row for row in self.alerts(code) if row[2] is None]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    home = tmp_path_factory.mktemp("outage-stores")
    made = Stores(
        EmbeddedPostgres(home / "postgres" / "data", free_port()), EmbeddedRedis(home / "redis", free_port())
    )
    made.postgres.start()
    made.redis.start(persistent=False)
    try:
        migrated = run_command([PYTHON, "manage.py", "migrate", "-v0"], made.env(), timeout=180)
        assert migrated.returncode == 0, migrated.stderr
        yield made
    finally:
        made.redis.stop()
        made.postgres.stop()


@pytest.fixture(scope="module")
def web(stores: Stores, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveWeb]:
    port = free_port()
    running = start_process(
        [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
        stores.env(MODELFORGE_BIND=f"127.0.0.1:{port}", MODELFORGE_WEB_WORKERS="1"),
        tmp_path_factory.mktemp("outage-web") / "gunicorn.log",
    )
    url = f"http://127.0.0.1:{port}"
    if not wait_until(lambda: http_ok(url + "/healthz"), 60):
        running.stop()
        pytest.fail("gunicorn did not answer /healthz within 60 s:\n" + running.log())
    yield LiveWeb(url, running)
    running.stop()


def readyz(web: LiveWeb) -> tuple[int, dict[str, Any]]:
    try:
        response = httpx.get(web.url + "/readyz", timeout=10)
    except httpx.HTTPError:
        return 0, {}
    return response.status_code, response.json()


def celery(stores: Stores, kind: str, log: Path) -> RunningProcess:
    argv = [PYTHON, "-m", "celery", "-A", "modelforge", kind, "-l", "INFO"]
    if kind == "worker":
        argv += [
            "--pool",
            "solo",
            "--without-mingle",
            "--without-gossip",
            "--hostname",
            f"outage-{os.getpid()}@%h",
        ]
    return start_process(argv, stores.env(), log)


def kill(process: RunningProcess) -> None:
    """SIGKILL to the whole process group: a worker that dies, not one that shuts down."""
    if process.process.poll() is None:
        os.killpg(process.process.pid, signal.SIGKILL)
        process.process.wait(10)


def test_readyz_is_503_while_no_new_database_connection_can_be_made_though_an_old_one_answers(
    stores: Stores, web: LiveWeb
):
    assert wait_until(lambda: readyz(web)[0] == 200, 30), web.process.log()[-3000:]
    old_session = psycopg.connect(stores.postgres.url, autocommit=True)
    postmaster = int((stores.postgres.data_dir / "postmaster.pid").read_text().split()[0])
    # A frozen postmaster is a stall: sessions already made keep answering, no new one is accepted.
    os.kill(postmaster, signal.SIGSTOP)
    try:
        assert old_session.execute("SELECT 1").fetchone() == (1,)
        assert wait_until(lambda: readyz(web)[0] == 503, 15)
        status, body = readyz(web)
        assert status == 503
        assert set(body) == {"code", "message", "correlation_id"}
        assert body["code"] == "DATABASE_UNREACHABLE"
        assert "no new connection within 2 s" in body["message"]
    finally:
        os.kill(postmaster, signal.SIGCONT)
        old_session.close()
    assert wait_until(lambda: readyz(web)[0] == 200, 30)


def test_a_stopped_database_is_503_then_recorded_with_its_window_and_the_worker_tasks_that_failed(
    stores: Stores, web: LiveWeb, tmp_path: Path
):
    from modelforge.celery import app

    worker = celery(stores, "worker", tmp_path / "worker.log")
    try:
        assert wait_until(lambda: " ready." in worker.log(), 60), worker.log()[-3000:]
        assert wait_until(lambda: readyz(web)[0] == 200, 30)
        failed = redis.Redis.from_url(stores.redis.url)
        failed.delete(outages.FAILED_TASKS_KEY)

        stopped_at = datetime.now(UTC)
        stores.postgres.stop()
        assert wait_until(lambda: readyz(web)[0] == 503, 15)
        assert readyz(web)[1]["code"] == "DATABASE_UNREACHABLE"
        # A task that runs meanwhile fails on the database; the worker notes it in Redis.
        with app.connection_for_write(stores.redis.url) as connection:
            app.send_task("core.record_worker_seen", connection=connection)
        assert wait_until(lambda: failed.llen(outages.FAILED_TASKS_KEY) >= 1, 30), worker.log()[-3000:]

        started_at = datetime.now(UTC)
        stores.postgres.start()
        assert wait_until(lambda: readyz(web)[0] == 200, 30)
    finally:
        kill(worker)

    def recorded() -> list[tuple[Any, ...]]:
        return [row for row in stores.alerts("DATABASE_UNREACHABLE") if row[2] >= started_at]

    assert wait_until(lambda: bool(recorded()), 20), web.process.log()[-3000:]
    [(_, raised_at, cleared_at, message, severity)] = recorded()
    assert severity == "critical"
    # Raised and cleared at once, with the window the web process saw (it checks every second).
    assert stopped_at - timedelta(seconds=1) <= raised_at <= stopped_at + timedelta(seconds=6)
    assert started_at <= cleared_at <= started_at + timedelta(seconds=15)
    assert "did not accept a new connection from" in message
    assert re.search(
        r"Worker tasks that failed on the database meanwhile: \d+ \(core\.record_worker_seen: \d+", message
    )
    assert "DATABASE_UNREACHABLE recorded" in web.process.log()


class Receiver:
    """A real webhook receiver on 127.0.0.1."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.events.extend(json.loads(body)["events"])
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def got(self, code: str, event: str) -> bool:
        return any(e["code"] == code and e["event"] == event for e in self.events)


def test_broker_unreachable_is_raised_while_redis_is_stopped_sent_by_the_web_and_cleared_with_its_window(
    stores: Stores, web: LiveWeb
):
    receiver = Receiver()
    stores.query(
        "INSERT INTO alerts_notificationchannel (name, kind, target, secret, min_severity, enabled, "
        "created_at, created_by, last_error) VALUES ('ops', 'webhook', %s, '', 'critical', true, "
        "now() - interval '1 minute', 'test', '')",
        [receiver.url],
    )
    try:
        assert wait_until(lambda: readyz(web)[0] == 200, 30)
        assert not stores.open_alerts("BROKER_UNREACHABLE")
        stores.redis.stop()
        try:
            assert wait_until(lambda: bool(stores.open_alerts("BROKER_UNREACHABLE")), 20), web.process.log()[
                -3000:
            ]
            status, body = readyz(web)
            assert (status, body["code"]) == (503, "BROKER_UNREACHABLE")
            # No worker gets a task without the broker: the web process delivered the alert itself.
            assert wait_until(lambda: receiver.got("BROKER_UNREACHABLE", "raised"), 20)
        finally:
            stores.redis.start(persistent=False)
        assert wait_until(lambda: not stores.open_alerts("BROKER_UNREACHABLE"), 20)
        [(_, raised_at, cleared_at, message, severity)] = stores.alerts("BROKER_UNREACHABLE")
        assert severity == "critical"
        window = f"({round((cleared_at - raised_at).total_seconds())} s)"
        assert "has not answered since" in message and "unreachable from" in message and window in message
        assert wait_until(lambda: receiver.got("BROKER_UNREACHABLE", "cleared"), 20)
        assert wait_until(lambda: readyz(web)[0] == 200, 30)
    finally:
        stores.query("UPDATE alerts_notificationchannel SET enabled = false WHERE name = 'ops'")
        receiver.server.shutdown()


def test_a_killed_worker_and_a_stopped_beat_are_missing_and_clear_when_they_run_again(
    stores: Stores, web: LiveWeb, tmp_path: Path
):
    # Nothing has run a worker task or a beat tick for LIMIT_S while the web process watched.
    stores.query("UPDATE core_installation SET worker_seen_at = NULL, beat_seen_at = NULL")
    missing = wait_until(lambda: bool(stores.open_alerts("WORKER_MISSING")), 3 * LIMIT_S)
    assert missing, web.process.log()[-3000:]
    assert wait_until(lambda: bool(stores.open_alerts("BEAT_MISSING")), 3 * LIMIT_S)

    worker = celery(stores, "worker", tmp_path / "worker.log")
    beat: RunningProcess | None = None
    try:
        # With no beat running, the web process's own probes reach the worker: it clears.
        assert wait_until(lambda: not stores.open_alerts("WORKER_MISSING"), 60), worker.log()[-3000:]
        assert stores.open_alerts("BEAT_MISSING")
        beat = celery(stores, "beat", tmp_path / "beat.log")
        # Beat stamps as it ticks: it clears.
        assert wait_until(lambda: not stores.open_alerts("BEAT_MISSING"), 60), beat.log()[-3000:]
        [(host,)] = stores.query("SELECT beat_seen_hostname FROM core_installation")
        assert host

        kill(worker)
        beat.stop()
        assert wait_until(lambda: bool(stores.open_alerts("WORKER_MISSING")), 3 * LIMIT_S)
        assert wait_until(lambda: bool(stores.open_alerts("BEAT_MISSING")), 3 * LIMIT_S)
    finally:
        kill(worker)
        if beat is not None:
            beat.stop()
    [(_, _, _, message, severity)] = stores.open_alerts("WORKER_MISSING")
    assert severity == "critical" and "No Celery worker has run a task since" in message
    [(_, _, _, message, _)] = stores.open_alerts("BEAT_MISSING")
    assert "Celery beat has not ticked since" in message
    cleared = [row for row in stores.alerts("WORKER_MISSING") if row[2] is not None]
    assert cleared and "ran a task at" in cleared[-1][3]
