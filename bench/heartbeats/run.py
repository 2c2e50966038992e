"""Heartbeat and sweep benchmark: many simulated agents against the web application under gunicorn.

    python bench/heartbeats/run.py [--nodes 2000] [--gpus 8] [--seconds 10] [--connections 16]
                                   [--web-workers 2] [--sweep-nodes 10000] [--no-ceiling] [--no-sweep]
                                   [--no-heartbeats]

Starts its own throw-away PostgreSQL 16 and Redis (the embedded stack, in a temporary folder), enrolls
``--nodes`` nodes, runs gunicorn + uvicorn workers on a free port, and drives heartbeats carrying
``--gpus`` GPUs of telemetry each with wrk (each request is a different node's heartbeat). Beside the
rate it prints where a heartbeat's time goes (CPU of the web workers and of PostgreSQL per heartbeat,
WAL bytes and flushes, HOT updates) and the machine's own ceiling: pgbench updating one random row of
a copy of the node table, at the same connections, against the same PostgreSQL. Then it times
liveness sweeps over ``--sweep-nodes`` nodes: nothing due, 1 % due, all due with the mass-loss guard
off (moved, an alert per node), all due with the loss confirmed (moved) and all due with the guard on
(held). Prints the figures; loopback only, bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import free_port, interpreter, start_web, throwaway_stack

GIB = 2**30
TICK = os.sysconf("SC_CLK_TCK")


def family(root: int) -> list[int]:
    """``root`` and every process descended from it (the gunicorn master and its workers; the postmaster
    and its backends)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, todo = [root], [root]
    while todo:
        parent = todo.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        todo += children
    return found


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU of each process still there."""
    seconds = {}
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return seconds


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two readings by the processes alive at both (pooled connections live throughout)."""
    return sum(after[pid] - before[pid] for pid in after if pid in before)


PG_STATS = """
SELECT pg_current_wal_lsn(),
       (SELECT wal_sync FROM pg_stat_wal),
       (SELECT sum(xact_commit) FROM pg_stat_database),
       coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'nodes_node'), 0),
       coalesce(sum(n_tup_hot_upd) FILTER (WHERE relname = 'nodes_node'), 0),
       coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'nodes_gpu'), 0),
       coalesce(sum(n_tup_hot_upd) FILTER (WHERE relname = 'nodes_gpu'), 0)
FROM pg_stat_user_tables
"""


def pg_stats(cursor: Any) -> dict[str, Any]:
    cursor.execute("SELECT pg_stat_force_next_flush()")
    cursor.execute(PG_STATS)
    lsn, syncs, commits, node_upd, node_hot, gpu_upd, gpu_hot = cursor.fetchone()
    return {
        "lsn": lsn,
        "syncs": syncs,
        "commits": commits,
        "node_upd": node_upd,
        "node_hot": node_hot,
        "gpu_upd": gpu_upd,
        "gpu_hot": gpu_hot,
    }


# The ceiling: one random row of a copy of the node table (same columns, indexes and row count), updated
# as a heartbeat updates it (found by its credential digest), one statement per transaction.
PGBENCH_SCRIPT = """\\set n random(1, {nodes})
UPDATE bench_ceiling SET last_heartbeat_at = now(), liveness = 'online', agent_version = '0.1.0',
    cpu_count = 64, load_1m = random() * 10, memory_available_bytes = 300 * 1073741824::bigint,
    shm_free_bytes = 60 * 1073741824::bigint
WHERE credential_hash = lpad(:n::text, 64, '0');
"""


def pgbench_bin() -> str | None:
    """pgbench of the embedded PostgreSQL 16 when it ships one, else the system's."""
    from modelforge.embedded import postgres_bin_dir

    own = postgres_bin_dir() / "pgbench"
    return str(own) if own.exists() else shutil.which("pgbench")


def pgbench_ceiling(workdir: Path, env: dict[str, str], nodes: int, connections: int, seconds: int) -> float:
    """Transactions per second of pgbench's single-row UPDATE, client pinned to core 1 as wrk is."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_ceiling")
        cursor.execute("CREATE TABLE bench_ceiling (LIKE nodes_node INCLUDING ALL)")
        cursor.execute(
            "INSERT INTO bench_ceiling (id, name, accelerator, enabled, liveness, last_heartbeat_at, "
            "enrolled_at, credential_hash, agent_version, agent_url, models_present, agent_error) "
            "SELECT gen_random_uuid(), 'ceiling-' || i, 'nvidia', true, 'online', now(), now(), "
            "lpad(i::text, 64, '0'), '0.1.0', '', %s::jsonb, '' FROM generate_series(1, %s) AS i",
            [json.dumps(report_body(0)["models_present"]), nodes],
        )
        cursor.execute("VACUUM ANALYZE bench_ceiling")
    script = workdir / "ceiling.sql"
    script.write_text(PGBENCH_SCRIPT.format(nodes=nodes))
    from urllib.parse import urlsplit

    url = urlsplit(env["MODELFORGE_DATABASE_URL"])
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            pgbench_bin() or "pgbench",
            "-h",
            url.hostname or "127.0.0.1",
            "-p",
            str(url.port),
            "-U",
            url.username or "postgres",
            "-n",
            "-c",
            str(connections),
            "-j",
            "1",
            "-T",
            str(seconds),
            "-f",
            str(script),
            url.path.lstrip("/"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_ceiling")
    tps = next(line for line in out.splitlines() if line.startswith("tps = "))
    return float(tps.split()[2])


def report_body(gpus: int, engine_servers: int = 0) -> dict:
    body = {
        "agent_version": "0.1.0",
        "accelerator": "nvidia",
        "agent_url": "http://10.1.2.3:8471",
        "cpu": {"count": 64, "load_1m": 3.2},
        "memory": {"total_bytes": 512 * GIB, "available_bytes": 300 * GIB},
        "shm": {"total_bytes": 64 * GIB, "free_bytes": 60 * GIB},
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{i:08x}-0000-0000-0000-{i:012x}",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_bytes": 80 * GIB,
                "memory_used_bytes": 30 * GIB,
                "memory_managed_bytes": 20 * GIB,
                "utilization_percent": 55,
                "temperature_c": 64,
            }
            for i in range(gpus)
        ],
        "models_present": [{"name": f"model-{i}", "kind": "weights_directory"} for i in range(4)],
    }
    if engine_servers:
        # Engine signals (apps/nodes/engine_signals.py): they cost a Redis write, not a database one.
        body["servers"] = [
            {
                "server_id": f"00000000-0000-4000-8000-{i:012x}",
                "engine": {"running": 3, "waiting": 1, "kv_cache_used": 0.42, "at": 1796000000.5},
            }
            for i in range(engine_servers)
        ]
    return body


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--sweep-nodes", type=int, default=10_000)
    parser.add_argument(
        "--engine-servers", type=int, default=0, help="servers with engine signals in each heartbeat"
    )
    parser.add_argument("--no-ceiling", action="store_true", help="skip pgbench's single-row UPDATE ceiling")
    parser.add_argument("--no-sweep", action="store_true", help="skip the liveness sweeps")
    parser.add_argument("--no-heartbeats", action="store_true", help="only the liveness sweeps")
    args = parser.parse_args()
    print(f"interpreter: {interpreter()}")
    if not shutil.which("wrk"):
        print("wrk is required: apt-get install wrk", file=sys.stderr)
        return 2

    web = None
    with throwaway_stack() as (workdir, env), contextlib.ExitStack() as cleanup:
        # The web process never outlives the benchmark, whatever happens.
        cleanup.callback(
            lambda: web is not None and web.poll() is None and os.killpg(web.pid, signal.SIGTERM)
        )
        from django.db import connection

        from apps.nodes.liveness import sweep
        from apps.nodes.models import CREDENTIAL_PREFIX, Node, digest

        if not args.no_heartbeats:
            credentials = [CREDENTIAL_PREFIX + secrets.token_urlsafe(24) for _ in range(args.nodes)]
            Node.objects.bulk_create(
                [
                    Node(name=f"bench-{i}", accelerator="nvidia", credential_hash=digest(c))
                    for i, c in enumerate(credentials)
                ],
                batch_size=2000,
            )
            (workdir / "credentials.txt").write_text("\n".join(credentials) + "\n")
            (workdir / "body.json").write_text(json.dumps(report_body(args.gpus, args.engine_servers)))
            connection.close()

            port = free_port()
            web = start_web(env, port, workers=args.web_workers)
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("gunicorn did not start") from None
                    time.sleep(0.3)

            wrk_env = {
                **env,
                "BENCH_CREDENTIALS": str(workdir / "credentials.txt"),
                "BENCH_BODY": str(workdir / "body.json"),
            }
            script = str(Path(__file__).with_name("heartbeat.lua"))

            def wrk(seconds: int) -> dict:
                out = subprocess.run(
                    [
                        "taskset",
                        "-c",
                        "1",
                        "wrk",
                        "-t1",
                        f"-c{args.connections}",
                        f"-d{seconds}s",
                        "--timeout",
                        "5s",
                        "-s",
                        script,
                        f"http://127.0.0.1:{port}",
                    ],
                    env=wrk_env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                line = next(line for line in out.splitlines() if line.startswith("RESULT "))
                return json.loads(line.removeprefix("RESULT "))

            wrk(2)  # warm-up, discarded
            data_dir = Path(env["MODELFORGE_HOME"]) / "postgres" / "data"
            postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
            web_pids, pg_pids = family(web.pid), family(postmaster)
            with connection.cursor() as cursor:
                stats_before = pg_stats(cursor)
            connection.close()
            web_before, pg_before = cpu_seconds(web_pids), cpu_seconds(pg_pids)
            result = wrk(args.seconds)
            web_cpu = cpu_used(web_before, cpu_seconds(web_pids))
            pg_cpu = cpu_used(pg_before, cpu_seconds(family(postmaster)))
            # The web workers' backends report their counters when they end: read them after the workers.
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(30)
            web = None
            time.sleep(0.5)
            with connection.cursor() as cursor:
                stats_after = pg_stats(cursor)
                cursor.execute("SELECT pg_wal_lsn_diff(%s, %s)", [stats_after["lsn"], stats_before["lsn"]])
                (wal_bytes,) = cursor.fetchone()
            connection.close()
            delta = {k: float(stats_after[k] - stats_before[k]) for k in stats_after if k != "lsn"}
            rate = result["requests"] / result["seconds"]
            print(
                f"heartbeats: {args.nodes} nodes x {args.gpus} GPUs, {args.connections} connections, "
                f"{args.web_workers} web workers pinned to core 0, wrk on core 1, {args.seconds} s"
            )
            print(
                f"  sustained      {rate:8.0f} heartbeats/s  ({result['requests']} requests, "
                f"{result['non_2xx']} non-2xx, {result['errors']} socket errors)"
            )
            print(
                f"  latency        p50 {result['p50_ms']:.1f} ms   p99 {result['p99_ms']:.1f} ms   "
                f"max {result['max_ms']:.1f} ms"
            )
            done = max(result["requests"], 1)
            print(
                f"  per heartbeat  web workers {web_cpu / done * 1e6:6.0f} us CPU   PostgreSQL "
                f"{pg_cpu / done * 1e6:6.0f} us CPU   WAL {float(wal_bytes) / done:6.0f} bytes   "
                f"{delta['syncs'] / done:.2f} WAL flushes"
            )
            print(
                f"  HOT updates    nodes {delta['node_hot']:.0f} of {delta['node_upd']:.0f}   "
                f"GPUs {delta['gpu_hot']:.0f} of {delta['gpu_upd']:.0f}"
            )
            if not args.no_ceiling:
                tps = pgbench_ceiling(workdir, env, args.nodes, args.connections, args.seconds)
                print(
                    f"  ceiling        {tps:8.0f} single-row UPDATEs/s (pgbench, {args.connections} "
                    f"connections, a copy of the node table, {args.seconds} s); heartbeats at "
                    f"{rate / tps:.0%} of it"
                )
            connection.close()
        if args.no_sweep:
            return 0

        # Sweeps over --sweep-nodes online nodes: none due, 1 % due, all due (a whole-fleet outage).
        from datetime import timedelta

        from django.conf import settings as django_settings
        from django.utils import timezone

        from apps.alerts.models import Alert
        from apps.nodes.models import ListeningClock

        def timed_sweep(
            due: int, guard: bool = False, confirmed: bool = False
        ) -> tuple[float, int, int, int, int, int]:
            Node.objects.all().delete()
            Alert.objects.all().delete()
            # A control plane that has been listening all along (no gap from the web run above), and the
            # mass-loss guard off unless measured: the transitions' cost is what is timed. With the guard
            # off nothing counts as many nodes at once, so each moved node gets an alert of its own.
            ListeningClock.objects.all().delete()
            django_settings.LIVENESS_MASS_LOSS_MIN_NODES = 3 if guard or confirmed else 10**9
            now = timezone.now()
            if confirmed:  # an operator confirmed the held loss: every node silent before now may go
                ListeningClock.objects.create(singleton=True, confirmed_at=now, confirmed_by="bench")
            fresh, old = now, now - timedelta(hours=1)
            Node.objects.bulk_create(
                [
                    Node(
                        name=f"sweep-{i}",
                        accelerator="cpu",
                        credential_hash=f"{i:064x}",
                        liveness="online",
                        last_heartbeat_at=old if i < due else fresh,
                    )
                    for i in range(args.sweep_nodes)
                ],
                batch_size=5000,
            )
            with connection.cursor() as cursor:
                # Twelve sweeps each delete and re-create the fleet: vacuumed as autovacuum keeps a real
                # table, or each sweep would scan the dead rows of all the sweeps before it.
                cursor.execute("VACUUM ANALYZE nodes_node, nodes_nodeevent, alerts_alert")
            # The set-up's own garbage (the fleet's model instances, made above in this process) is
            # collected before the clock starts: left pending, it made the sweep's first few thousand
            # allocations start a full collection of this process's heap, 60-70 ms that a worker, which
            # makes no such fleet before its sweep, does not pay (bench/heartbeats/README.md, 2026-12-01).
            gc.collect()
            started = time.perf_counter()
            moved = sweep()
            elapsed = (time.perf_counter() - started) * 1000
            # What every reader sees now (the fleet's states included): the sweep did move them.
            stale, offline = (Node.objects.in_liveness(state).count() for state in ("stale", "offline"))
            return elapsed, len(moved.offline), len(moved.stale), Alert.objects.count(), stale, offline

        print(
            f"sweep over {args.sweep_nodes} online nodes (a few moved: a row and an event each; many at "
            "once: the fleet's state on the clock and one event)"
        )
        for label, due, guard, confirmed in (
            ("nothing due", 0, False, False),
            ("1 % due", args.sweep_nodes // 100, False, False),
            # The guard off: every node goes offline with an alert of its own.
            ("all due, guard off", args.sweep_nodes, False, False),
            # The guard on (the default) and the loss confirmed: every node goes offline (the fleet's
            # state, one event row) under one node_offline for the fleet.
            ("all due, confirmed", args.sweep_nodes, False, True),
            # The guard on (the default): none goes offline, one NODE_MASS_LOSS alert, and the nodes go
            # stale (the fleet's state, one event row) under one NODE_STALE for the fleet.
            ("all due, held", args.sweep_nodes, True, False),
        ):
            runs = [timed_sweep(due, guard, confirmed) for _ in range(3)]
            print(
                f"  {label:<20}{statistics.median(run[0] for run in runs):8.1f} ms  (median of 3; "
                f"{runs[0][1]} moved to offline, {runs[0][2]} to stale, {runs[0][3]} alert rows; now "
                f"{runs[0][4]} stale, {runs[0][5]} offline)"
            )
        connection.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
