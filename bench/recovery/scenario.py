"""The recovery drill: a whole control plane, its fleet and its clients, through a restore or an outage.

    from bench.recovery.scenario import run_scenario
    figures = run_scenario(workdir, database_url=..., redis_url=..., variant="restore")

Real processes only: the web process (gunicorn + uvicorn workers), a Celery worker, Celery beat (which
drives the liveness sweep, reconcile, recover and the capability check), three agents in CPU mode
heartbeating every second, each launching real echo engines. Everything is set up through the operator
API, as an operator would: four servers placed (profile ``test-echo``), a cluster whose members are
attached to them, a capability bound to it by a routing tier, a client credential scoped to it. Then
steady gateway traffic (``POST /v1/embeddings``, every request's start, end and status recorded) and:

- ``restore``: a backup (``POST /api/v1/backups``, until verified); one more server placed after it
  (books restored from the backup do not have it); a wait longer than the offline limit, so every
  restored heartbeat is older than that limit; the restore (``POST /api/v1/restores``) until it
  completes; traffic for ``settle_s`` more, and until reconcile has re-recorded the late server.
- ``outage``: the fifth server is placed too; then web, worker and beat are stopped for longer than
  the offline limit (agents and engines keep running, unheard) and started again.

Measured (the returned dict): requests total and failed; requests in flight at the switch-over (the
moment the restored database took the service name: the restore's ``consistent_as_of`` plus its
``rpo_seconds``) or when the outage began; requests failed from 5 s after the switch-over (or after the
web process answered again); seconds until every request to the capability answered 200 again; the
servers whose processes stopped (each agent's signed ``GET /v1/servers`` before and after, by pid);
node events to ``offline`` and ``stale``, ``NODE_MASS_LOSS`` alerts and server failures recorded
after the event (read from the service database afterwards); whether the late server is in the books;
5xx answers of the operator API after the event. With ``control=True`` one agent is then stopped for
good, to show the same detector does take a really silent node offline (its seconds to offline).

The database at ``database_url`` is the drill's own (it is migrated here; a restore renames it and
keeps the replaced one beside it: ``drop_databases`` removes the family). So is the Redis database at
``redis_url``: it is flushed before and after. Every process started here is stopped before returning,
whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import redis
from psycopg import sql

from agent.protocol import signed_headers
from modelforge.embedded import alive

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
VARIANTS = ("restore", "outage")
CAPABILITY = "rag.embedding@1"
MODEL = "tiny-model"
AGENTS = 3

# Short thresholds, in the proportions of the defaults (10 / 35 / 90 / 20 s):
# - stale after four intervals: heartbeats back off to at most three intervals while the control plane is
#   away, so a node heard again within three is never stale for it;
# - the listening gap must exceed the web processes' stamp (apps.nodes.listening.WEB_TICK_S, 5 s): with a
#   shorter gap every stamp looks like the end of a gap, the grace period restarts every 5 s and no node
#   could ever go offline -- a drill run so would measure nothing.
HEARTBEAT_INTERVAL = 1
NODE_STALE_AFTER = 4
NODE_OFFLINE_AFTER = 8
LIVENESS_SWEEP_INTERVAL = 1
LISTENING_GAP = 7

T = TypeVar("T")


class ScenarioFailed(RuntimeError):
    """The drill could not be driven to its end (not a measured outcome: those are figures)."""


def say_to_stderr(message: str) -> None:
    print(f"[drill {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- databases and ports ---------------------------------------------------------------------------------


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before by this process: once a probe socket closes, the kernel
    may hand the same port to the next bind, and two drill agents were once given one port (CI, 2026-12-07:
    AGENT_PORT_UNAVAILABLE, "every agent online: not within 60 s")."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def create_database(server_url: str, name: str) -> str:
    """An empty database ``name`` (dropped first with its family) on the server of ``server_url``;
    returns its URL."""
    url = _with_database(server_url, name)
    drop_databases(url)
    with psycopg.connect(_with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url


def drop_databases(database_url: str) -> None:
    """Drop the drill's database and every database a restore made beside it (``<name>_restore_<id>``,
    ``<name>_pre_restore_<id>``)."""
    name = _database_name(database_url)
    with psycopg.connect(_with_database(database_url, "postgres"), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s OR datname LIKE %s OR datname LIKE %s",
            [name, f"{name}\\_restore\\_%", f"{name}\\_pre\\_restore\\_%"],
        ).fetchall()
        for (found,) in rows:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(found)))


def _flush_redis(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=3)
    try:
        client.flushdb()
    finally:
        client.close()


# --- processes ------------------------------------------------------------------------------------------


@dataclass
class Child:
    """A process this drill started (in a session of its own), its output in a log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 20) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def spawn(name: str, argv: list[str], env: dict[str, str], logs: Path) -> Child:
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Child(name, process, log_path)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, interval_s: float = 0.25) -> T:
    """Poll ``probe`` until it returns something other than None (or False); that is returned."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = probe()
        except (httpx.HTTPError, psycopg.Error, OSError, KeyError, ValueError):
            found = None
        if found is not None and found is not False:
            return found
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


# --- HTTP: what was asked and answered ------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One HTTP request: wall-clock start and end, status (0: no answer at all)."""

    started: float
    ended: float
    status: int
    path: str = ""


class Api:
    """The operator API with the operator key; every call is recorded."""

    def __init__(self, base_url: str, key: str) -> None:
        self.client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=20)
        self.calls: list[Call] = []

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        started = time.time()
        try:
            response = self.client.request(method, path, json=body)
        except httpx.HTTPError:
            self.calls.append(Call(started, time.time(), 0, path))
            raise
        self.calls.append(Call(started, time.time(), response.status_code, path))
        return response

    def ok(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.request(method, path, body)
        if response.status_code not in (200, 201, 202):
            raise ScenarioFailed(f"{method} {path} answered {response.status_code}: {response.text[:1000]}")
        found: dict[str, Any] = response.json()
        return found

    def get(self, path: str) -> dict[str, Any] | None:
        """GET that tolerates failure (None): for polling through a switch-over."""
        try:
            response = self.request("GET", path)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        found: dict[str, Any] = response.json()
        return found

    def close(self) -> None:
        self.client.close()


class Load:
    """Requests on ``threads`` threads at ``rate`` per second in all, each recorded, until stopped."""

    def __init__(
        self, rate: float, threads: int, send: Callable[[httpx.Client, int], int], name: str
    ) -> None:
        self.rate, self.threads, self.send, self.name = rate, threads, send, name
        self.calls: list[Call] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self.threads):
            thread = threading.Thread(
                target=self._run, args=(index,), name=f"{self.name}-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, index: int) -> None:
        interval = self.threads / self.rate
        next_at = time.monotonic() + interval * index / self.threads
        number = index
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                delay = next_at - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    break
                started = time.time()
                try:
                    status = self.send(client, number)
                except httpx.HTTPError:
                    status = 0
                self.calls.append(Call(started, time.time(), status))
                number += self.threads
                # Paced, never catching up in a burst after a slow answer.
                next_at = max(next_at + interval, time.monotonic())


def in_flight(calls: list[Call], start: float, end: float | None = None) -> list[Call]:
    """Calls under way at some moment of [start, end] (an instant when ``end`` is None)."""
    end = start if end is None else end
    return [c for c in calls if c.started <= end and c.ended >= start]


def recovery_s(calls: list[Call], since: float) -> float:
    """Seconds from ``since`` until every later request answered 200: the end of the last failure."""
    failed = [c.ended for c in calls if c.started >= since and c.status != 200]
    return round(max(0.0, max(failed) - since), 2) if failed else 0.0


# --- agents ---------------------------------------------------------------------------------------------


@dataclass
class Agent:
    name: str
    url: str
    env: dict[str, str]
    child: Child | None = None


def agent_env(control_plane: str, home: Path, *, name: str, secret: str, token: str) -> dict[str, str]:
    """A real agent in CPU mode on loopback, heartbeating every second, one model on its disk (as
    tests.fixtures.agent_environment and the agent_node fixture build them)."""
    models = home / "models"
    (models / MODEL).mkdir(parents=True, exist_ok=True)
    (models / MODEL / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    env.pop("NVIDIA_VISIBLE_DEVICES", None)
    env.update(
        PYTHONUNBUFFERED="1",
        MODELFORGE_AGENT_CONTROL_PLANE_URL=control_plane,
        MODELFORGE_AGENT_STATE_VOLUME=str(home / "state"),
        MODELFORGE_AGENT_MODELS_DIR=str(models),
        MODELFORGE_AGENT_ACCELERATOR_MODE="cpu",
        MODELFORGE_AGENT_CLUSTER_SECRET=secret,
        MODELFORGE_AGENT_LISTEN_HOST="127.0.0.1",
        MODELFORGE_AGENT_ADVERTISE_HOST="127.0.0.1",
        MODELFORGE_AGENT_PORT=str(free_port()),
        MODELFORGE_AGENT_HEARTBEAT_INTERVAL=str(HEARTBEAT_INTERVAL),
        MODELFORGE_AGENT_NAME=name,
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=token,
    )
    return env


def agent_servers(agent: Agent, secret: str) -> dict[str, dict[str, Any]]:
    """What the agent says it runs: its signed ``GET /v1/servers``, by server id."""
    response = httpx.get(
        agent.url + "/v1/servers", headers=signed_headers(secret, "GET", "/v1/servers"), timeout=5
    )
    response.raise_for_status()
    return {str(s["server_id"]): s for s in response.json()["servers"]}


def running_processes(agents: list[Agent], secret: str) -> dict[str, int]:
    """Server id -> pid of every server process the agents report running."""
    out: dict[str, int] = {}
    for agent in agents:
        for server_id, seen in agent_servers(agent, secret).items():
            if seen.get("state") == "running":
                out[server_id] = int(seen["pid"])
    return out


# --- the drill ------------------------------------------------------------------------------------------


@dataclass
class ControlPlane:
    """Web, worker and beat on one database and Redis; started and stopped together."""

    env: dict[str, str]
    port: int
    logs: Path
    web_workers: int
    children: dict[str, Child] = field(default_factory=dict)
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        suffix = f"-{self.starts}" if self.starts > 1 else ""
        web_env = {**self.env, "MODELFORGE_BIND": f"127.0.0.1:{self.port}"}
        web_env["MODELFORGE_WEB_WORKERS"] = str(self.web_workers)
        self.children["web"] = spawn(
            f"web{suffix}",
            [
                PYTHON,
                "-m",
                "gunicorn",
                "-c",
                "python:modelforge.gunicorn_conf",
                "modelforge.asgi:application",
            ],
            web_env,
            self.logs,
        )
        self.children["worker"] = spawn(
            f"worker{suffix}",
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "modelforge",
                "worker",
                "-l",
                "INFO",
                "--concurrency",
                "2",
                "--without-mingle",
                "--without-gossip",
                "--hostname",
                f"drill-{os.getpid()}-{self.starts}@%h",
            ],
            self.env,
            self.logs,
        )
        self.children["beat"] = spawn(
            f"beat{suffix}",
            [PYTHON, "-m", "celery", "-A", "modelforge", "beat", "-l", "INFO"],
            self.env,
            self.logs,
        )

    def wait_healthy(self, timeout_s: float = 60) -> float:
        def healthy() -> bool:
            for child in self.children.values():
                if not child.alive():
                    raise ScenarioFailed(f"{child.name} exited ({child.process.returncode}):\n{child.tail()}")
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200

        wait_for("the web process answering /healthz", healthy, timeout_s)
        return time.time()

    def stop(self) -> None:
        for name in ("beat", "worker", "web"):
            child = self.children.get(name)
            if child is not None:
                child.stop()

    def tails(self) -> str:
        return "\n".join(f"--- {c.name} ---\n{c.tail(3000)}" for c in self.children.values())


def control_plane_env(
    workdir: Path, database_url: str, redis_url: str
) -> tuple[dict[str, str], dict[str, str]]:
    """The environment of web, worker, beat and manage.py; and the secrets (operator key, cluster secret)."""
    secrets_ = {
        "operator_key": secrets.token_urlsafe(32),
        "cluster_secret": secrets.token_urlsafe(32),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELFORGE_AGENT_", "MODELFORGE_TEST_"))}
    for name in ("MODELFORGE_OBSERVABILITY_DATABASE_URL", "MODELFORGE_LOCAL_NODE", "MODELFORGE_BIND"):
        env.pop(name, None)
    (workdir / "backups").mkdir(parents=True, exist_ok=True)
    env.update(
        PYTHONUNBUFFERED="1",
        MODELFORGE_ENV="development",
        MODELFORGE_DEBUG="false",
        MODELFORGE_LOG_LEVEL="INFO",
        MODELFORGE_HOME=str(workdir / "home"),
        MODELFORGE_DATABASE_URL=database_url,
        MODELFORGE_REDIS_URL=redis_url,
        MODELFORGE_BACKUP_ROOT=str(workdir / "backups"),
        MODELFORGE_SECRET_KEY=secrets.token_urlsafe(48),
        MODELFORGE_OPERATOR_API_KEY=secrets_["operator_key"],
        MODELFORGE_CLUSTER_SECRET=secrets_["cluster_secret"],
        MODELFORGE_HEARTBEAT_INTERVAL=str(HEARTBEAT_INTERVAL),
        MODELFORGE_NODE_STALE_AFTER=str(NODE_STALE_AFTER),
        MODELFORGE_NODE_OFFLINE_AFTER=str(NODE_OFFLINE_AFTER),
        MODELFORGE_LIVENESS_SWEEP_INTERVAL=str(LIVENESS_SWEEP_INTERVAL),
        MODELFORGE_LISTENING_GAP=str(LISTENING_GAP),
    )
    return env, secrets_


def _manage(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise ScenarioFailed(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def _query(database_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


@contextlib.contextmanager
def _stage(name: str, say: Callable[[str], None], diagnose: Callable[[], str]) -> Iterator[None]:
    say(name)
    try:
        yield
    except ScenarioFailed as exc:
        raise ScenarioFailed(f"{name}: {exc}\n{diagnose()}") from None


def run_scenario(
    workdir: Path,
    *,
    database_url: str,
    redis_url: str,
    variant: str = "restore",
    web_workers: int = 1,
    rate: float = 30.0,
    traffic_threads: int = 4,
    settle_s: float = 15.0,
    control: bool = True,
    say: Callable[[str], None] = say_to_stderr,
) -> dict[str, Any]:
    """Drive the drill (module docstring) and return its figures."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: one of {', '.join(VARIANTS)}")
    workdir = Path(workdir)
    logs = workdir / "logs"
    env, keys = control_plane_env(workdir, database_url, redis_url)
    secret = keys["cluster_secret"]
    _flush_redis(redis_url)
    say(f"{variant}: migrating {_database_name(database_url)}")
    _manage(env, "migrate", "--no-input")

    plane = ControlPlane(env, free_port(), logs, web_workers)
    agents: list[Agent] = []
    loads: list[Load] = []
    api: Api | None = None

    def diagnose() -> str:
        agent_logs = "\n".join(f"--- {a.name} ---\n{a.child.tail(1500)}" for a in agents if a.child)
        return plane.tails() + "\n" + agent_logs

    try:
        with _stage("starting web, worker and beat", say, diagnose):
            plane.start()
            plane.wait_healthy()
        api = Api(plane.url, keys["operator_key"])
        figures = _drive(
            api,
            plane,
            agents,
            loads,
            variant,
            secret,
            workdir,
            settle_s,
            rate,
            traffic_threads,
            say,
            diagnose,
        )
        figures.update(
            variant=variant,
            web_workers=web_workers,
            thresholds=f"heartbeat {HEARTBEAT_INTERVAL} s, stale {NODE_STALE_AFTER} s, offline "
            f"{NODE_OFFLINE_AFTER} s, sweep {LIVENESS_SWEEP_INTERVAL} s, listening gap {LISTENING_GAP} s",
            logs=str(logs),
        )
        if control:
            with _stage("control: one agent stopped for good", say, diagnose):
                figures["control_offline_s"] = _control(api, agents)
        return figures
    finally:
        for load in loads:
            load.stop()
        if api is not None:
            api.close()
        engines: list[int] = []
        for agent in agents:
            with contextlib.suppress(httpx.HTTPError, OSError, KeyError, ValueError):
                engines += [int(s["pid"]) for s in agent_servers(agent, secret).values()]
            if agent.child is not None:
                agent.child.stop()
        plane.stop()
        # Engines stop with their agent; one left behind (an agent killed) is stopped by its pid.
        for pid in engines:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
        with contextlib.suppress(redis.RedisError):
            _flush_redis(redis_url)


def _drive(
    api: Api,
    plane: ControlPlane,
    agents: list[Agent],
    loads: list[Load],
    variant: str,
    secret: str,
    workdir: Path,
    settle_s: float,
    rate: float,
    traffic_threads: int,
    say: Callable[[str], None],
    diagnose: Callable[[], str],
) -> dict[str, Any]:
    database_url = plane.env["MODELFORGE_DATABASE_URL"]

    with _stage(f"enrolling {AGENTS} agents", say, diagnose):
        for index in range(AGENTS):
            token = api.ok("POST", "/api/v1/enrollment-tokens", {"note": f"drill agent {index}"})["token"]
            name = f"drill-node-{index}"
            env = agent_env(plane.url, workdir / "agents" / name, name=name, secret=secret, token=token)
            agent = Agent(name, f"http://127.0.0.1:{env['MODELFORGE_AGENT_PORT']}", env)
            agent.child = spawn(name, [PYTHON, "-m", "agent"], env, plane.logs)
            agents.append(agent)

        def all_online() -> bool:
            nodes = (api.get("/api/v1/nodes?limit=100") or {}).get("results", [])
            return sum(n["liveness"] == "online" for n in nodes) == AGENTS

        wait_for("every agent online", all_online, 60)

    def place(name: str, node: str) -> str:
        body = {"name": name, "profile": "test-echo", "model": MODEL, "node": node}
        return str(api.ok("POST", "/api/v1/servers", body)["id"])

    def running(server_ids: list[str]) -> None:
        def all_running() -> bool:
            states = [(api.get(f"/api/v1/servers/{sid}") or {}).get("state") for sid in server_ids]
            if "failed" in states:
                raise ScenarioFailed(f"a server failed to start: {states}")
            return all(state == "running" for state in states)

        wait_for(f"{len(server_ids)} server(s) running", all_running, 90)

    with _stage("placing four servers", say, diagnose):
        servers = [place(f"echo-{i}", f"drill-node-{i % AGENTS}") for i in range(4)]
        running(servers)

    with _stage("a cluster, a capability bound to it, a client credential", say, diagnose):
        cluster = api.ok("POST", "/api/v1/clusters", {"name": "drill"})["id"]
        # Members first: membership is locked once servers are attached.
        members = [
            api.ok("POST", "/api/v1/cluster-members", {"cluster": cluster, "name": f"m{i}", "gpus": 0})["id"]
            for i in range(len(servers))
        ]
        for member, server in zip(members, servers, strict=True):
            api.ok("POST", f"/api/v1/cluster-members/{member}/attach", {"server": server})
        capability = api.ok("POST", "/api/v1/capabilities", {"name": CAPABILITY})["id"]
        api.ok("POST", "/api/v1/routing-tiers", {"capability": capability, "tier": 0, "cluster": cluster})
        credential = api.ok("POST", "/api/v1/client-credentials", {"name": "drill", "scopes": [CAPABILITY]})[
            "credential"
        ]
        headers = {"Authorization": f"Bearer {credential}"}

        def embed(client: httpx.Client, number: int) -> int:
            return client.post(
                plane.url + "/v1/embeddings",
                json={"model": CAPABILITY, "input": f"drill {number}"},
                headers=headers,
            ).status_code

        with httpx.Client(timeout=10) as probe:
            wait_for("the capability answering 200", lambda: embed(probe, 0) == 200, 30)

    traffic = Load(rate, traffic_threads, embed, "traffic")

    operator = {"Authorization": str(api.client.headers["Authorization"])}

    def watch(client: httpx.Client, number: int) -> int:
        path = ("/api/v1/servers?limit=100", "/api/v1/nodes?limit=100")[number % 2]
        return client.get(plane.url + path, headers=operator).status_code

    watcher = Load(2.0, 1, watch, "api")
    loads += [traffic, watcher]
    traffic.start()
    watcher.start()
    time.sleep(3)
    figures: dict[str, Any] = {}
    backup_id, consistent_as_of = 0, 0.0

    if variant == "restore":
        with _stage("a backup, until verified", say, diagnose):
            backup_id = api.ok("POST", "/api/v1/backups")["id"]

            def verified() -> dict[str, Any] | None:
                backup = api.get(f"/api/v1/backups/{backup_id}") or {}
                if backup.get("state") == "failed":
                    raise ScenarioFailed(
                        f"backup failed: {backup.get('reason_code')} {backup.get('reason_message')}"
                    )
                return backup if backup.get("state") == "verified" else None

            backup = wait_for("the backup verified", verified, 180, 0.5)
            consistent_as_of = _ts(backup["consistent_as_of"]) or 0.0
    with _stage("one more server, after the backup", say, diagnose):
        late = place("echo-after-backup", "drill-node-1")
        running([late])
    before = running_processes(agents, secret)
    say(f"{len(before)} server processes running")

    if variant == "restore":
        # Every heartbeat the backup holds is older than the offline limit when the restore switches over.
        time.sleep(max(0.0, consistent_as_of + NODE_OFFLINE_AFTER + 3 - time.time()))
        with _stage("the restore, until it completes", say, diagnose):
            requested_at = time.time()
            restore_id = api.ok(
                "POST", "/api/v1/restores", {"backup": backup_id, "reason": "recovery drill"}
            )["id"]

            def finished() -> dict[str, Any] | None:
                restore = api.get(f"/api/v1/restores/{restore_id}") or {}
                return restore if restore.get("state") in ("completed", "failed") else None

            restore = wait_for("the restore finished", finished, 300, 0.5)
            if restore["state"] != "completed":
                raise ScenarioFailed(
                    f"restore {restore['state']}: {restore['failure_code']} {restore['failure_message']}"
                )
        phase = next(p for p in restore["phases"] if p["name"] == "switch_over")
        window = (_ts(phase["started_at"]) or 0.0, _ts(phase["finished_at"]) or 0.0)
        switched_at = (_ts(restore["consistent_as_of"]) or 0.0) + float(restore["rpo_seconds"])
        since = requested_at
        figures.update(
            restore_s=round((_ts(restore["finished_at"]) or 0.0) - (_ts(restore["started_at"]) or 0.0), 1),
            rpo_s=round(float(restore["rpo_seconds"]), 1),
        )
    else:
        with _stage("web, worker and beat stopped for longer than the offline limit", say, diagnose):
            since = switched_at = time.time()
            plane.stop()
            down_s = NODE_OFFLINE_AFTER + LISTENING_GAP
            time.sleep(down_s)
            plane.start()
            resumed = plane.wait_healthy()
            window = (switched_at, resumed)
            figures["down_s"] = round(resumed - switched_at, 1)

    with _stage("traffic on, and reconcile re-recording the late server", say, diagnose):
        settle_until = time.time() + settle_s

        def late_recorded() -> float | None:
            server = api.get(f"/api/v1/servers/{late}") or {}
            return time.time() if server.get("state") == "running" else None

        # Reconcile runs every 30 s (the beat schedule): the late server may take that long to come back.
        recorded_at: float | None
        try:
            recorded_at = wait_for("the late server in the books", late_recorded, 45, 0.5)
        except ScenarioFailed:
            recorded_at = None
        time.sleep(max(0.0, settle_until - time.time()))
    traffic.stop()
    watcher.stop()
    after = running_processes(agents, secret)

    # "Serving again" counts from when the gateway could answer: the rename, or the web process answering.
    serving_from = switched_at if variant == "restore" else window[1]
    calls = traffic.calls
    failed = [c for c in calls if c.status != 200]
    flight = in_flight(calls, switched_at)
    flight_window = in_flight(calls, *window)
    api_calls = api.calls + watcher.calls
    stopped = sorted(sid for sid, pid in before.items() if after.get(sid) != pid or not alive(pid))

    def count(query: str) -> int:
        return int(_query(database_url, query, datetime.fromtimestamp(since).astimezone())[0][0])

    figures.update(
        requests_total=len(calls),
        requests_failed=len(failed),
        failed_statuses=dict(Counter(c.status for c in failed)),
        in_flight_at_switch=len(flight),
        in_flight_during_switch=len(flight_window),
        failed_in_flight=sum(c.status != 200 for c in flight_window),
        failed_during_switch=sum(c.status != 200 for c in calls if window[0] <= c.started <= window[1]),
        failed_after_switch_5s=sum(c.status != 200 for c in calls if c.started >= serving_from + 5),
        recovery_s=recovery_s(calls, serving_from),
        switch_window_s=round(window[1] - window[0], 2),
        servers_running_before=len(before),
        servers_stopped=len(stopped),
        stopped_server_ids=stopped,
        # A node's own event names it in node_id; a transition of many at once names them all in nodes.
        nodes_offline=count(
            "SELECT count(DISTINCT n) FROM nodes_nodeevent, unnest(coalesce(nodes, ARRAY[node_id])) AS n "
            "WHERE to_liveness = 'offline' AND at >= %s"
        ),
        stale_events=count(
            "SELECT count(*) FROM nodes_nodeevent, unnest(coalesce(nodes, ARRAY[node_id])) AS n "
            "WHERE to_liveness = 'stale' AND at >= %s"
        ),
        mass_loss_alerts=count(
            "SELECT count(*) FROM alerts_alert WHERE code = 'NODE_MASS_LOSS' AND last_raised_at >= %s"
        ),
        servers_failed=count(
            "SELECT count(DISTINCT server_id) FROM servers_serverevent WHERE to_state = 'failed' AND at >= %s"
        ),
        late_server_recorded=recorded_at is not None,
        late_server_recorded_s=round(max(0.0, recorded_at - serving_from), 1) if recorded_at else None,
        api_calls=len(api_calls),
        api_5xx_after_switch=sum(c.status >= 500 for c in api_calls if c.started > window[1]),
        api_5xx_total=sum(c.status >= 500 for c in api_calls),
    )
    say(
        f"{figures['requests_total']} requests, {figures['requests_failed']} failed, "
        f"{figures['servers_stopped']} servers stopped, {figures['nodes_offline']} nodes offline"
    )
    return figures


def _control(api: Api, agents: list[Agent]) -> float:
    """Stop one agent for good: the detector that stayed quiet through the drill must take it offline."""
    victim = agents[-1]
    assert victim.child is not None
    victim.child.stop()
    stopped_at = time.time()

    def offline() -> bool:
        nodes = (api.get("/api/v1/nodes?limit=100") or {}).get("results", [])
        return any(n["name"] == victim.name and n["liveness"] == "offline" for n in nodes)

    wait_for(f"{victim.name} offline", offline, NODE_OFFLINE_AFTER + LISTENING_GAP + 15, 0.5)
    return round(time.time() - stopped_at, 1)
