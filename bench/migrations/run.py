"""Migration benchmark: a cutover's reindex through the platform against the same reindex done straight.

    .venv/bin/python bench/migrations/run.py                      # 100,000 documents, batch 128, 384 dims
    .venv/bin/python bench/migrations/run.py --documents 10000 --rounds 3    # a quick look

1. PostgreSQL 16 and Redis: the embedded stack in a temporary folder, on free ports, unless
   ``MODELFORGE_DATABASE_URL`` / ``MODELFORGE_REDIS_URL`` are set: then those servers are used (a fresh
   control-plane database and a fresh vector-store database on that PostgreSQL, both dropped at the
   end; Redis database ``--redis-db``, flushed before and after).
2. The stack, through the operator API: web (gunicorn), a Celery worker (``--concurrency 1``), one agent
   with two echo engines placed (profile ``test-echo``): ``enc-a-8d`` behind ``rag.embedding@1`` and
   ``enc-b-<dimension>d`` behind ``rag.embedding@2``, each space measured; the vector store registered;
   the source index ``kb_v1`` (``--documents`` texts of about 200 characters, 8-dimensional vectors)
   written with the adapter; the alias ``kb`` bound to it.
3. Each of ``--rounds`` rounds: direct, the engine's own loop without the platform, in this process:
   ``read_documents``, ``POST /v1/embeddings`` to the target engine's port, ``write_vectors`` into a
   fresh index, batch by batch; then the platform: a cutover to ``rag.embedding@2`` planned and started
   through the API, the worker reindexing through the gateway, timed from the cutover's events
   (``reindexing`` to ``verifying``), then waited for until ``ready_to_cut`` (or ``failed``).
4. A table: documents/s of each run, the median ratio against the target (the platform at least 80 %
   of direct), the CPU seconds each process spent during each run and the time the stack's threads
   waited for a core (from /proc). Exit status 1 when the target is missed or a cutover failed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.engines.echo import vector
from apps.embedding_migrations.adapters.base import Row
from apps.embedding_migrations.adapters.pgvector import PgvectorAdapter
from bench.recovery.scenario import (
    PYTHON,
    ROOT,
    Agent,
    Api,
    Child,
    ScenarioFailed,
    agent_env,
    agent_servers,
    control_plane_env,
    create_database,
    drop_databases,
    free_port,
    spawn,
    wait_for,
)
from modelforge.embedded import EmbeddedStack, alive

SOURCE, TARGET = "rag.embedding@1", "rag.embedding@2"
SOURCE_MODEL, SOURCE_DIMENSION = "enc-a-8d", 8
SOURCE_INDEX, DIRECT_INDEX, ALIAS = "kb_v1", "kb_direct", "kb"
TARGET_PCT = 80.0
TICKS = os.sysconf("SC_CLK_TCK")
PYSPY = str(Path(PYTHON).with_name("py-spy"))
VOCABULARY = (
    "the a of and to in for on with by from at as is are was be this that which an or not it its their "
    "gpu node cluster model server engine request answer latency token batch queue worker store index "
    "vector embedding search query document alias space capability gateway route tier credential scope "
    "backup restore replica artifact weights checkpoint memory disk network policy operator deployment "
    "rollout upgrade failure retry timeout limit budget quota throughput measure report figure table "
    "customer invoice contract support ticket release note change issue summary section paragraph"
)
TABLE_COLUMNS = ("bench", "worker", "web", "engine", "agent", "postgres", "other")
# The code measured: its digests are printed, and a change during the run (processes started before and
# after it would run different code) is reported.
MEASURED_CODE = (
    "apps/embedding_migrations/runner.py",
    "apps/embedding_migrations/spaces.py",
    "apps/embedding_migrations/adapters/pgvector.py",
    "apps/gateway/gateway.py",
    "apps/gateway/upstream.py",
    "agent/engines/echo.py",
)


def code_digests() -> dict[str, str]:
    return {path: hashlib.sha256((ROOT / path).read_bytes()).hexdigest()[:10] for path in MEASURED_CODE}


def say(message: str) -> None:
    print(f"[migrations {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def texts(count: int, seed: int = 14) -> list[str]:
    """``count`` deterministic texts of about 200 characters, each unique (its number leads)."""
    vocabulary = VOCABULARY.split()
    rng = random.Random(seed)  # noqa: S311 - sample texts, not secrets
    out = []
    for i in range(count):
        words = [f"#{i}"]
        length = len(words[0])
        target = rng.randint(170, 230)
        while length < target:
            word = rng.choice(vocabulary)
            words.append(word)
            length += len(word) + 1
        out.append(" ".join(words).capitalize() + ".")
    return out


# --- CPU seconds from /proc ------------------------------------------------------------------------------


def _stat(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def group_cpu(pgid: int) -> float:
    """User + system CPU seconds of the live processes of the process group ``pgid``."""
    total = 0
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def server_cpu(postmaster: int) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster, its reaped children, its live children."""
    own = _stat(postmaster)
    if own is None:
        return 0.0
    total = sum(int(v) for v in own[11:15])
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def queued(pgids: set[int], postmaster: int) -> float:
    """Seconds the live threads of these process groups and of the PostgreSQL server spent runnable but
    waiting for a core (/proc/<pid>/task/<tid>/schedstat): the cost of sharing the machine."""
    total = 0
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is None or not (int(fields[2]) in pgids or postmaster in (int(entry), int(fields[1]))):
            continue
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{entry}/task"):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    total += int(Path(f"/proc/{entry}/task/{task}/schedstat").read_text().split()[1])
    return total / 1e9


def postmaster_of(conn: psycopg.Connection[Any]) -> int:
    """The pid of the server's postmaster: the parent of this connection's backend."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    fields = _stat(int(row[0])) if row else None
    if fields is None:
        raise ScenarioFailed("the PostgreSQL server's processes are not visible here (/proc)")
    return int(fields[1])


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine (every core): user, nice, system, irq, softirq, steal."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6, 7)) / TICKS


@dataclass
class Meter:
    """CPU seconds of named sources, between ``start()`` and ``stop()``."""

    sources: dict[str, Callable[[], float]]
    spent: dict[str, float] = field(default_factory=dict)
    _begin: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self._begin = {name: read() for name, read in self.sources.items()}

    def stop(self) -> dict[str, float]:
        """Seconds per source; ``other``: the machine's busy seconds that none of the sources spent."""
        self.spent = {name: read() - self._begin[name] for name, read in self.sources.items()}
        waited = self.spent.pop("queued", None)
        if "machine" in self.spent:
            machine = self.spent.pop("machine")
            self.spent["other"] = max(0.0, machine - sum(self.spent.values()))
        if waited is not None:
            self.spent["queued"] = waited
        return self.spent


# --- the stack -------------------------------------------------------------------------------------------


@dataclass
class Stack:
    """Web, worker and one agent on a fresh database; the API; the engines' pids and ports."""

    workdir: Path
    database_url: str
    redis_url: str
    web_workers: int
    env: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    children: dict[str, Child] = field(default_factory=dict)
    api: Api | None = None
    url: str = ""
    agent_url: str = ""
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tails(self) -> str:
        return "\n".join(f"--- {c.name} ---\n{c.tail(2500)}" for c in self.children.values())

    def start(self, target_model: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env, self.keys = control_plane_env(self.workdir, self.database_url, self.redis_url)
        env.update(
            MODELFORGE_LOG_LEVEL="WARNING",
            MODELFORGE_GATEWAY_URL=self.url,
            MODELFORGE_WORKER_MISSING_AFTER="86400",
            MODELFORGE_BEAT_MISSING_AFTER="86400",
        )
        self.env = env
        _flush_redis(self.redis_url)
        say(f"migrating {urlsplit(self.database_url).path.lstrip('/')}")
        done = subprocess.run(
            [PYTHON, "manage.py", "migrate", "--no-input"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise ScenarioFailed(f"migrate failed:\n{done.stderr[-3000:]}")
        logs = self.workdir / "logs"
        web = [
            PYTHON,
            "-m",
            "gunicorn",
            "-c",
            "python:modelforge.gunicorn_conf",
            "modelforge.asgi:application",
        ]
        self.children["web"] = spawn(
            "web",
            web,
            {
                **env,
                "MODELFORGE_BIND": f"127.0.0.1:{port}",
                "MODELFORGE_WEB_WORKERS": str(self.web_workers),
                "MODELFORGE_LOG_LEVEL": "INFO",  # the gateway logs each refused request (a 401 counted)
            },
            logs,
        )
        worker = [PYTHON, "-m", "celery", "-A", "modelforge", "worker", "-l", "WARNING", "--concurrency", "1"]
        worker += ["--without-mingle", "--without-gossip", "--hostname", f"bench-migrations-{os.getpid()}@%h"]
        self.children["worker"] = spawn("worker", worker, env, logs)

        def healthy() -> bool:
            for child in self.children.values():
                if not child.alive():
                    raise ScenarioFailed(f"{child.name} exited ({child.process.returncode}):\n{child.tail()}")
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200

        wait_for("the web process answering /healthz", healthy, 90)
        self.api = api = Api(self.url, self.keys["operator_key"])
        api.client.timeout = httpx.Timeout(600.0, connect=10.0)

        say("enrolling an agent, placing two echo engines")
        token = api.ok("POST", "/api/v1/enrollment-tokens", {"note": "bench migrations"})["token"]
        home = self.workdir / "agent"
        agent = agent_env(self.url, home, name="bench-node", secret=self.keys["cluster_secret"], token=token)
        for model in (SOURCE_MODEL, target_model):
            (home / "models" / model).mkdir(parents=True, exist_ok=True)
            (home / "models" / model / "config.json").write_text("{}")
        self.children["agent"] = spawn("agent", [PYTHON, "-m", "agent"], agent, logs)
        self.agent_url = f"http://127.0.0.1:{agent['MODELFORGE_AGENT_PORT']}"

        def online() -> bool:
            nodes = (api.get("/api/v1/nodes?limit=10") or {}).get("results", [])
            return any(n["liveness"] == "online" for n in nodes)

        wait_for("the agent online", online, 60)
        for capability, name, model in ((SOURCE, "enc-a", SOURCE_MODEL), (TARGET, "enc-b", target_model)):
            server = api.ok("POST", "/api/v1/servers", {"name": name, "profile": "test-echo", "model": model})

            def running(sid: str = server["id"]) -> dict[str, Any] | None:
                found = api.get(f"/api/v1/servers/{sid}") or {}
                if found.get("state") == "failed":
                    raise ScenarioFailed(f"server failed: {found.get('failure_message')}")
                return found if found.get("state") == "running" else None

            self.engines[capability] = wait_for(f"{name} running", running, 90)
            created = api.ok("POST", "/api/v1/capabilities", {"name": capability})
            tier = {"capability": created["id"], "tier": 0, "server": server["id"]}
            api.ok("POST", "/api/v1/routing-tiers", tier)
            self.engines[capability]["space"] = api.ok(
                "POST", "/api/v1/embedding-spaces/measure", {"capability": capability}
            )

    def stop(self) -> None:
        engine_pids: list[int] = []
        with contextlib.suppress(httpx.HTTPError, OSError, KeyError, ValueError, AttributeError):
            agent = Agent("bench-node", self.agent_url, {})
            engine_pids = [int(s["pid"]) for s in agent_servers(agent, self.keys["cluster_secret"]).values()]
        engine_pids += [int(e["pid"]) for e in self.engines.values() if e.get("pid")]
        if self.api is not None:
            self.api.close()
        for name in ("agent", "worker", "web"):
            child = self.children.get(name)
            if child is not None:
                child.stop()
        for pid in set(engine_pids):
            if alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
        with contextlib.suppress(redis.RedisError):
            _flush_redis(self.redis_url)


def _flush_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=3)
    try:
        client.flushdb()
    finally:
        client.close()


def _with_path(url: str, path: str, scheme: str | None = None) -> str:
    parts = urlsplit(url)
    return urlunsplit((scheme or parts.scheme, parts.netloc, path, parts.query, parts.fragment))


# --- the runs --------------------------------------------------------------------------------------------


def write_source(adapter: PgvectorAdapter, space: str, count: int) -> None:
    adapter.create_target(SOURCE_INDEX, dimension=SOURCE_DIMENSION, space=space)
    documents = texts(count)
    for start in range(0, count, 1000):
        rows = [
            Row(f"d{i:07d}", documents[i], vector(documents[i], SOURCE_MODEL, SOURCE_DIMENSION))
            for i in range(start, min(start + 1000, count))
        ]
        adapter.write_vectors(SOURCE_INDEX, rows)


def checkpoint(server_url: str) -> None:
    """Flush dirty pages first, so neither run pays for the other's (or the set-up's) writes."""
    with psycopg.connect(_with_path(server_url, "/postgres"), autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def direct_run(
    adapter: PgvectorAdapter, engine_url: str, model: str, dimension: int, batch: int
) -> dict[str, float]:
    """The reindex loop of apps/embedding_migrations/runner.py as a plain client would run it (no
    gateway, credential, progress or heartbeat; the answer decoded and its count and dimension checked):
    its seconds, and the seconds spent reading, embedding (request and JSON decoding) and writing."""
    phases = {"read": 0.0, "embed": 0.0, "write": 0.0}
    with httpx.Client(base_url=engine_url, timeout=httpx.Timeout(60.0, connect=5.0)) as client:
        started = time.perf_counter()
        cursor = None
        while True:
            t0 = time.perf_counter()
            documents = adapter.read_documents(SOURCE_INDEX, after=cursor, limit=batch)
            if not documents:
                break
            t1 = time.perf_counter()
            answer = client.post(
                "/v1/embeddings", json={"model": model, "input": [d.content for d in documents]}
            )
            answer.raise_for_status()
            data = sorted(answer.json()["data"], key=lambda item: item["index"])
            vectors = [item["embedding"] for item in data]
            if len(vectors) != len(documents) or any(len(v) != dimension for v in vectors):
                raise ScenarioFailed("the engine answered the wrong number or dimension of vectors")
            t2 = time.perf_counter()
            adapter.write_vectors(
                DIRECT_INDEX, [Row(d.id, d.content, v) for d, v in zip(documents, vectors, strict=True)]
            )
            cursor = documents[-1].id
            t3 = time.perf_counter()
            phases["read"] += t1 - t0
            phases["embed"] += t2 - t1
            phases["write"] += t3 - t2
        return {"seconds": time.perf_counter() - started, **phases}


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


@contextlib.contextmanager
def profiled(folder: Path | None, pids: dict[str, int]) -> Iterator[None]:
    """With ``folder``: py-spy samples each of ``pids`` and its children into ``<name>.txt`` (raw stacks,
    idle ones too: where the wall-clock time goes)."""
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                PYSPY,
                "record",
                "--pid",
                str(pid),
                "--subprocesses",
                "--format",
                "raw",
                "--rate",
                "200",
                "--idle",
            ]
            + ["--output", str(folder / f"{name}.txt"), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()


def platform_run(
    stack: Stack, control: psycopg.Connection[Any], alias: int, batch: int, meter: Meter, profile: Path | None
) -> dict[str, Any]:
    """Plan and start a cutover; the reindex timed by its events, CPU metered over the reindexing stage."""
    assert stack.api is not None
    api = stack.api
    planned = api.ok(
        "POST", "/api/v1/cutovers", {"alias": alias, "target_capability": TARGET, "batch_size": batch}
    )
    cutover = planned["id"]
    web_log_before = stack.children["web"].log_path.read_text(errors="replace").count(" -> 401 ")
    started = time.time()
    api.ok("POST", f"/api/v1/cutovers/{cutover}/start", {"reason": "bench"})

    def stage() -> str:
        row = control.execute(
            "SELECT stage FROM embedding_migrations_cutover WHERE id = %s", [cutover]
        ).fetchone()
        return str(row[0]) if row else ""

    wait_for("the reindex begun", lambda: stage() not in ("planned", "provisioning"), 120, 0.05)
    pids = {"worker": stack.children["worker"].process.pid, "web": stack.children["web"].process.pid}
    with profiled(profile, pids):
        meter.start()
        wait_for("the reindex done", lambda: stage() not in ("reindexing",), 24 * 3600, 0.1)
        meter.stop()
    say("reindexed; verifying (the target's HNSW index is built here)")

    def settled() -> dict[str, Any] | None:
        found = api.get(f"/api/v1/cutovers/{cutover}")
        return found if found and found["stage"] in ("ready_to_cut", "failed") else None

    body = wait_for("ready_to_cut", settled, 24 * 3600, 1.0)
    row = control.execute(
        "SELECT reindex_seconds, docs_done FROM embedding_migrations_cutover WHERE id = %s", [cutover]
    ).fetchone()
    assert row is not None
    events = {e["to_stage"]: e for e in body["events"]}
    figures: dict[str, Any] = {
        "id": cutover,
        "stage": body["stage"],
        "failure": f"{body['failure_code']}: {body['failure_message']}",
        "verification": body["verification"],
        "target_index": body["target_index"],
        "worker_seconds": float(row[0]),
        "docs_done": int(row[1]),
        "refused_401": stack.children["web"].log_path.read_text(errors="replace").count(" -> 401 ")
        - web_log_before,
    }
    if "reindexing" in events and "verifying" in events:
        figures["seconds"] = _at(events["verifying"]) - _at(events["reindexing"])
        figures["start_to_reindexed"] = _at(events["verifying"]) - started
    ended = events.get("ready_to_cut") or events.get("failed")
    if ended is not None and "verifying" in events:
        figures["verify_seconds"] = _at(ended) - _at(events["verifying"])
    return figures


# --- the report ------------------------------------------------------------------------------------------


def print_report(
    args: argparse.Namespace,
    target_model: str,
    rounds: list[tuple[dict[str, Any], dict[str, Any]]],
    code: tuple[dict[str, str], dict[str, str]],
) -> bool:
    """The table (one row per run), the median rates against the target; True when it is met."""
    n = args.documents
    print()
    print(
        f"Reindex of {n:,} documents, batch {args.batch}: {SOURCE_MODEL} ({SOURCE_DIMENSION} dimensions) -> "
        f"{target_model} ({args.dimension} dimensions), echo engine, pgvector, {os.cpu_count()} cores"
    )
    print()
    cpu_head = " | ".join(f"CPU s {c}" for c in TABLE_COLUMNS)
    print(f"| run | seconds | documents/s | of direct | {cpu_head} | waited for a core s |")
    print("|---|---:|---:|---:|" + "---:|" * (len(TABLE_COLUMNS) + 1))
    for number, (direct, platform) in enumerate(rounds, 1):
        suffix = f" {number}" if len(rounds) > 1 else ""
        for label, run in ((f"direct{suffix}", direct), (f"platform{suffix}", platform)):
            share = f"{100 * direct['seconds'] / run['seconds']:.1f} %" if run is platform else ""
            cpu = " | ".join(f"{run['cpu'].get(c, 0.0):.1f}" for c in TABLE_COLUMNS)
            rate = f"{n / run['seconds']:,.0f}"
            print(
                f"| {label} | {run['seconds']:.1f} | {rate} | {share} | {cpu} | {run['cpu']['queued']:.1f} |"
            )
    print()
    direct_s = statistics.median(d["seconds"] for d, _ in rounds)
    platform_s = statistics.median(p["seconds"] for _, p in rounds)
    ratio = 100 * direct_s / platform_s
    met = ratio >= TARGET_PCT
    median = "median " if len(rounds) > 1 else ""
    print(
        f"{median}documents/s: direct {n / direct_s:,.0f}, platform {n / platform_s:,.0f}; platform / direct "
        f"{ratio:.1f} % (target >= {TARGET_PCT:.0f} %: {'met' if met else 'MISSED'})"
    )
    batches = -(-n // args.batch)

    def ms(seconds: float) -> str:
        return f"{seconds / batches * 1000:.1f} ms"

    for number, (direct, platform) in enumerate(rounds, 1):
        worker_rate = platform["docs_done"] / platform["worker_seconds"]
        print(
            f"{'round ' + str(number) + ', ' if len(rounds) > 1 else ''}per batch ({batches:,}): direct "
            f"{ms(direct['seconds'])} (read {ms(direct['read'])}, embed {ms(direct['embed'])}, write "
            f"{ms(direct['write'])}); platform {ms(platform['seconds'])}, of which the worker's own count "
            f"{ms(platform['worker_seconds'])} (reindex_seconds: {worker_rate:,.0f} documents/s)"
        )
        print(
            f"  platform: start request -> reindexed {platform['start_to_reindexed']:.1f} s; gateway 401s "
            f"before the new credential was known: {platform['refused_401']}; then the verification (the "
            f"HNSW build, checks) {platform.get('verify_seconds', 0.0):.1f} s"
        )
    print(
        "CPU s: from /proc, over each run; postgres: the whole server, other: the rest of the machine "
        "(other users' processes, the kernel); waited for a core: the stack's threads, runnable, not running"
    )
    before, after = code
    print("code: " + ", ".join(f"{Path(p).name} {d}" for p, d in before.items()))
    changed = [Path(p).name for p in before if before[p] != after[p]]
    if changed:
        print(f"WARNING: {', '.join(changed)} changed during the run: the processes may run different code")
    for number, (_, platform) in enumerate(rounds, 1):
        if platform["stage"] != "ready_to_cut":
            checks = platform["verification"].get("checks", {})
            failed = {name: check for name, check in checks.items() if not check.get("passed")}
            print(
                f"FAILED: round {number}: the cutover is {platform['stage']}, not ready_to_cut: "
                f"{platform['failure']}"
            )
            print(f"  failed checks: {failed}")
            met = False
    return met


def measure(
    args: argparse.Namespace, stack: Stack, server_url: str, control_url: str, dsn: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Set up the source and the alias, then ``--rounds`` of a direct run and a platform run."""
    assert stack.api is not None
    api = stack.api
    target_model = f"enc-b-{args.dimension}d"
    source_space = stack.engines[SOURCE]["space"]["key"]
    target_space = stack.engines[TARGET]["space"]
    if target_space["dimension"] != args.dimension:
        raise ScenarioFailed(f"the target engine measured {target_space['dimension']} dimensions")
    api.ok("POST", "/api/v1/vector-stores", {"name": "kb-store", "kind": "pgvector", "dsn": dsn})
    store = (api.get("/api/v1/vector-stores") or {})["results"][0]["id"]
    with PgvectorAdapter(dsn) as adapter, psycopg.connect(control_url, autocommit=True) as control:
        say(f"writing the source index: {args.documents:,} documents")
        write_source(adapter, source_space, args.documents)
        say("binding the alias (builds the source's HNSW index)")
        alias = api.ok(
            "POST",
            "/api/v1/consumer-aliases",
            {
                "store": store,
                "name": ALIAS,
                "index": SOURCE_INDEX,
                "capability": SOURCE,
                "query_capability": "kb.query@1",
            },
        )["id"]
        postmaster = postmaster_of(control)
        engine_pid = int(stack.engines[TARGET]["pid"])
        sources: dict[str, Callable[[], float]] = {
            "bench": self_cpu,
            "worker": lambda: group_cpu(stack.children["worker"].process.pid),
            "web": lambda: group_cpu(stack.children["web"].process.pid),
            "engine": lambda: group_cpu(engine_pid),
            "agent": lambda: group_cpu(stack.children["agent"].process.pid),
            "postgres": lambda: server_cpu(postmaster),
            "machine": machine_cpu,
            "queued": lambda: queued(
                {os.getpgid(0), engine_pid, *(c.process.pid for c in stack.children.values())}, postmaster
            ),
        }
        engine_url = f"http://127.0.0.1:{stack.engines[TARGET]['port']}"
        rounds = []
        for number in range(1, args.rounds + 1):
            say(f"round {number}, direct: {args.documents:,} documents in batches of {args.batch}")
            adapter.create_target(DIRECT_INDEX, dimension=args.dimension, space=target_space["key"])
            checkpoint(server_url)
            meter = Meter(sources)
            meter.start()
            direct: dict[str, Any] = direct_run(adapter, engine_url, target_model, args.dimension, args.batch)
            direct["cpu"] = meter.stop()
            if adapter.count(DIRECT_INDEX) != args.documents:
                raise ScenarioFailed("the direct run did not write every document")
            say(f"direct: {direct['seconds']:.1f} s; platform: a cutover through the API")
            checkpoint(server_url)
            meter = Meter(sources)
            platform = platform_run(stack, control, alias, args.batch, meter, args.profile)
            platform["cpu"] = meter.spent
            if "seconds" not in platform:
                raise ScenarioFailed(f"the cutover failed before its reindex ended: {platform['failure']}")
            say(f"platform: {platform['seconds']:.1f} s; the cutover is {platform['stage']}")
            sample = [f"d{i:07d}" for i in range(0, args.documents, max(1, args.documents // 7))]
            made = adapter.read_vectors(platform["target_index"], sample)
            if adapter.read_vectors(DIRECT_INDEX, sample) != made:
                raise ScenarioFailed("the direct run's vectors and the platform's differ")
            rounds.append((direct, platform))
            if number < args.rounds:
                api.ok("POST", f"/api/v1/cutovers/{platform['id']}/roll-back", {"reason": "next round"})
                adapter.drop(platform["target_index"])
                adapter.drop(DIRECT_INDEX)
    return rounds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=128, help="documents per batch (the cutover's)")
    parser.add_argument("--dimension", type=int, default=384, help="the target model's (at most 2000)")
    parser.add_argument("--rounds", type=int, default=1, help="direct + platform, this many times")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--redis-db", type=int, default=12, help="with MODELFORGE_REDIS_URL: the one used")
    parser.add_argument("--profile", type=Path, help="py-spy the worker and web during the platform runs")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args()
    if not 1 <= args.dimension <= 2000 or not 1 <= args.batch <= 2048 or min(args.documents, args.rounds) < 1:
        parser.error("--dimension 1-2000, --batch 1-2048, --documents and --rounds at least 1")

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-migrations-"))
    workdir.chmod(0o755)  # the embedded PostgreSQL runs as an unprivileged user when we are root
    environ = dict(os.environ)
    environ.setdefault("MODELFORGE_EMBEDDED_PG_PORT", str(free_port()))
    environ.setdefault("MODELFORGE_EMBEDDED_REDIS_PORT", str(free_port()))
    embedded = EmbeddedStack.from_environment(workdir / "services", environ)
    databases: list[str] = []
    stack: Stack | None = None
    code = 1
    digests = code_digests()
    try:
        urls = embedded.start(persistent=False)
        server_url = urls.get("MODELFORGE_DATABASE_URL") or environ["MODELFORGE_DATABASE_URL"]
        redis_url = urls.get("MODELFORGE_REDIS_URL") or _with_path(
            environ["MODELFORGE_REDIS_URL"], f"/{args.redis_db}"
        )
        control_url = create_database(server_url, f"mf_bench_migrations_{os.getpid()}")
        databases.append(control_url)
        vectors_url = create_database(server_url, f"mf_bench_vectors_{os.getpid()}")
        databases.append(vectors_url)
        dsn = _with_path(vectors_url, urlsplit(vectors_url).path, scheme="postgresql")
        stack = Stack(workdir, control_url, redis_url, args.web_workers)
        stack.start(f"enc-b-{args.dimension}d")
        rounds = measure(args, stack, server_url, control_url, dsn)
        met = print_report(args, f"enc-b-{args.dimension}d", rounds, (digests, code_digests()))
        code = 0 if met else 1
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
        code = 130
    except ScenarioFailed as exc:
        print(f"bench failed: {exc}\n{stack.tails() if stack else ''}", file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if stack is not None:
            stack.stop()
        for url in reversed(databases):
            with contextlib.suppress(psycopg.Error):
                drop_databases(url)
        embedded.destroy()
        if args.keep:
            print(f"logs: {workdir}/logs", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
