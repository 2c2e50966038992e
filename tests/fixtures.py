"""Shared fixtures: the real PostgreSQL 16 test database, real Redis, real gunicorn and Celery processes."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from rest_framework.test import APIClient

from modelforge.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BIN = Path(PYTHON).parent
ARTIFACTS = ROOT / "test-artifacts"


def _flush_again_after_a_deadlock() -> None:
    """A transactional test's teardown flush (one TRUNCATE of every table) can deadlock with the session's
    live web process rebuilding its routing table from the rows the test just wrote: a join takes its
    tables' locks one at a time, the TRUNCATE in its own order. PostgreSQL aborts the flush, whose
    transaction rolls back whole, so it is run again; left failed, Django's teardown stops half-way and
    every later test finds the observability store still forbidden (seen once in CI, 2026-12-07)."""
    from django.db import OperationalError
    from django.db.backends.postgresql.operations import DatabaseOperations

    flush = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self: DatabaseOperations, sql_list: list[str]) -> None:
        for attempt in range(5):
            try:
                flush(self, sql_list)
                return
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    DatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign,assignment]


_flush_again_after_a_deadlock()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of the test's own, for a test that freezes it (SIGSTOP): the session's is never frozen."""
    made = EmbeddedRedis(tmp_path / "redis", free_port())
    made.start(persistent=False)
    yield made
    pid = made.pid()
    if pid is not None:
        os.kill(pid, signal.SIGCONT)  # (a failed test may leave it frozen)
    made.stop()


def database_url(name: str | None = None) -> str:
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{name or db['NAME']}"


def admin_connection() -> psycopg.Connection[Any]:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db.get("HOST") or "127.0.0.1",
        port=int(db.get("PORT") or 5432),
        user=db.get("USER") or "postgres",
        password=db.get("PASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    )


@functools.cache
def live_web_port() -> int:
    """The session web process's port, chosen first: every worker started here embeds through it."""
    return free_port()


def process_env(**overrides: str | None) -> dict[str, str]:
    """The environment for a child process: ours, with ``overrides`` (``None`` removes a variable).
    A worker's cutover reindex embeds through the session's web process (``MODELFORGE_GATEWAY_URL``)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MODELFORGE_GATEWAY_URL", f"http://127.0.0.1:{live_web_port()}")
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_command(argv: list[str], env: dict[str, str], timeout: float = 60) -> Finished:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return Finished(done.returncode, done.stdout, done.stderr)


@dataclass
class RunningProcess:
    """A real child process with its combined output in a log file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def start_process(argv: list[str], env: dict[str, str], log_path: Path) -> RunningProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return RunningProcess(process, log_path)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def sweep_until(settings: Any, predicate: Callable[[], bool], timeout: float = 30) -> bool:
    """Real time with short liveness limits: sweep the way beat does (often) until ``predicate`` holds.

    Jumping the clock past the limits is not possible once real processes are listening: the web
    workers stamp real time (apps.nodes.listening), and a sweep far ahead of the stamps sees a control
    plane nobody was listening for."""
    from apps.nodes.liveness import sweep

    settings.NODE_STALE_AFTER, settings.NODE_OFFLINE_AFTER = 2, 3

    def swept() -> bool:
        sweep()
        return predicate()

    return wait_until(swept, timeout, interval=0.5)


def process_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP): the kill tests wait for a process to pause itself."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "T"
    except OSError:
        return False


def stop_servers_of_agent(state: Path) -> int:
    """Kill the model servers an agent with state volume ``state`` started and left behind (they run in
    sessions of their own, so an agent killed, frozen or stopped mid-test does not take them along); a
    test's teardown calls it after stopping the agent. Returns how many it killed."""
    marker = f"MODELFORGE_AGENT_STATE_VOLUME={state}".encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if marker in environ:
            try:
                os.killpg(int(entry.name), signal.SIGKILL)
            except OSError:
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
    return killed


def run_in_own_loop(main: Callable[[], Any]) -> Any:
    """``asyncio.run(main())`` on a thread of its own, and its result: the browser tests keep an event
    loop running in the test thread, where ``asyncio.run`` would refuse."""
    import asyncio
    import threading

    failures: list[BaseException] = []
    results: list[Any] = []

    def target() -> None:
        try:
            results.append(asyncio.run(main()))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
    return results[0]


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass
class LiveWeb:
    url: str
    process: RunningProcess


def start_web(log_path: Path, **overrides: str) -> LiveWeb:
    """Another web process (gunicorn, one worker) on a free port of its own, on the test database and
    Redis, quiet about a missing worker and beat and without listening stamps (as ``live_web``);
    ``overrides`` are further settings, or other values of these. Answering /healthz when returned;
    ``.process.stop()`` it."""
    port = free_port()
    defaults = {
        "MODELFORGE_DATABASE_URL": database_url(),
        "MODELFORGE_BIND": f"127.0.0.1:{port}",
        "MODELFORGE_WEB_WORKERS": "1",
        "MODELFORGE_WORKER_MISSING_AFTER": "86400",
        "MODELFORGE_BEAT_MISSING_AFTER": "86400",
        "MODELFORGE_LISTENING_STAMPS": "false",
    }
    env = process_env(**(defaults | overrides))
    running = start_process(
        [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
        env,
        log_path,
    )
    url = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: http_ok(url + "/healthz"), 60), running.log()
    return LiveWeb(url, running)


@pytest.fixture(scope="session")
def live_web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveWeb]:
    """The real web application under gunicorn + uvicorn workers, on the test database."""
    port = live_web_port()
    env = process_env(
        MODELFORGE_DATABASE_URL=database_url(),
        MODELFORGE_BIND=f"127.0.0.1:{port}",
        MODELFORGE_WEB_WORKERS="1",
        MODELFORGE_LOG_LEVEL="INFO",
        # Benching for seconds, not the default 30: the sin-bin tests watch backends come back.
        MODELFORGE_LB_BASE_BENCH_S="2",
        # The session's web process outlives the limits with no worker or beat beside it: without these,
        # its outage checks would raise WORKER_MISSING / BEAT_MISSING into other tests' alerts.
        MODELFORGE_WORKER_MISSING_AFTER="86400",
        MODELFORGE_BEAT_MISSING_AFTER="86400",
        # Its listening stamps (real time) would tell the liveness tests, which move the clock, that no
        # web process was listening. The stamps are drilled with web processes of their own
        # (bench/recovery's scenario, tests/test_drill_restore.py).
        MODELFORGE_LISTENING_STAMPS="false",
        # Agents here heartbeat every second (agent_environment); the control plane's answer sets their
        # interval, so it says 1 s too, or the drills' short liveness limits would see them as silent.
        MODELFORGE_HEARTBEAT_INTERVAL="1",
    )
    log_path = tmp_path_factory.mktemp("web") / "gunicorn.log"
    running = start_process(
        [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
        env,
        log_path,
    )
    url = f"http://127.0.0.1:{port}"
    if not wait_until(lambda: http_ok(url + "/healthz"), 60):
        running.stop()
        pytest.fail("gunicorn did not answer /healthz within 60 s:\n" + running.log())
    yield LiveWeb(url, running)
    running.stop()


@pytest.fixture(scope="session")
def celery_worker_process(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProcess]:
    """A real Celery worker process consuming from the test Redis, writing to the test database."""
    from modelforge.celery import app

    env = process_env(MODELFORGE_DATABASE_URL=database_url(), MODELFORGE_LOG_LEVEL="INFO")
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    hostname = f"test-worker-{os.getpid()}@%h"
    running = start_process(
        [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "modelforge",
            "worker",
            "--pool",
            "solo",
            "--without-mingle",
            "--without-gossip",
            "--hostname",
            hostname,
            "-l",
            "INFO",
        ],
        env,
        log_path,
    )

    def answers() -> bool:
        return bool(app.control.ping(timeout=0.5))

    if not wait_until(answers, 60, interval=0.5):
        running.stop()
        pytest.fail("the Celery worker did not answer a ping within 60 s:\n" + running.log())
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def _forget_authentication_failures() -> None:
    """Every test starts with no address blocked for failed API credentials (modelforge.auththrottle):
    the counters live in the shared test Redis, and the suite's own refusals come from one address."""
    import redis

    try:
        client = redis.Redis.from_url(
            settings.CELERY_BROKER_URL, socket_connect_timeout=0.3, socket_timeout=0.3
        )
        keys = list(client.scan_iter("modelforge:authfail:*", count=1000))
        if keys:
            client.delete(*keys)
    except (redis.RedisError, OSError):
        pass  # a test that stops Redis: nothing is counted there either


@pytest.fixture
def operator_client() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {settings.OPERATOR_API_KEY}")
    return client


@pytest.fixture
def anonymous_client() -> APIClient:
    return APIClient()


@pytest.fixture
def scratch_database() -> Iterator[Callable[[], str]]:
    """Creates empty databases on the test server; drops them afterwards. Returns their names."""
    created: list[str] = []

    def make() -> str:
        name = f"mf_scratch_{os.getpid()}_{len(created)}"
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return name

    yield make
    with admin_connection() as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without these, chromium spends its start-up reaching for Google's hosts on a closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not shutil.which("chromium") and not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed; `make test` installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls (creating the
    # user) are still plain synchronous code, which Django would otherwise refuse here.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            yield launched
            launched.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def log_in(page: Any, base_url: str, username: str, password: str) -> None:
    page.goto(base_url + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_selector("h1")


def agent_environment(
    control_plane_url: str,
    state: Path,
    *,
    secret: str,
    name: str,
    token: str | None = None,
    models: Path | None = None,
) -> dict[str, str]:
    """The environment of a real agent (CPU mode, on loopback, heartbeat every second) for tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_AGENT")}
    env.pop("NVIDIA_VISIBLE_DEVICES", None)
    env.update(
        PYTHONUNBUFFERED="1",
        MODELFORGE_AGENT_CONTROL_PLANE_URL=control_plane_url,
        MODELFORGE_AGENT_STATE_VOLUME=str(state),
        MODELFORGE_AGENT_ACCELERATOR_MODE="cpu",
        MODELFORGE_AGENT_CLUSTER_SECRET=secret,
        MODELFORGE_AGENT_LISTEN_HOST="127.0.0.1",
        MODELFORGE_AGENT_ADVERTISE_HOST="127.0.0.1",
        MODELFORGE_AGENT_PORT=str(free_port()),
        MODELFORGE_AGENT_HEARTBEAT_INTERVAL="1",
        MODELFORGE_AGENT_NAME=name,
    )
    if token:
        env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] = token
    if models:
        env["MODELFORGE_AGENT_MODELS_DIR"] = str(models)
    return env


def clear_usage() -> None:
    """Forget the gateway's usage counters and the roll-up's mark (tests share one Redis)."""
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    keys = list(client.scan_iter("modelforge:usage:*"))
    if keys:
        client.delete(*keys)


def clear_limit_counts() -> None:
    """Forget every credential's limit windows and token totals: a new test database numbers its
    credentials from 1 again, and an earlier run may have left the same credential's counts in Redis."""
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    keys = list(client.scan_iter("modelforge:limit:*"))
    if keys:
        client.delete(*keys)
