"""Scaling benchmark: a fleet of simulated agents heartbeating at the default interval into two web processes,
with the liveness sweep, telemetry sampling and the dashboard running beside it.

    python bench/scaling/run.py [--nodes 10000] [--gpus 4] [--interval 10] [--seconds 30]
                                [--connections 100] [--sample-every 15] [--page-every 3]

Starts its own throw-away PostgreSQL 16 and Redis (the embedded stack, in a temporary folder), enrolls
``--nodes`` nodes (bulk-created as bench/heartbeats does), and runs TWO gunicorn web processes (one uvicorn
worker each, not pinned: the kernel places them) on ports 56810 and 56811. Two wrk instances, one per web
process, each send half of the fleet's heartbeats (``--gpus`` GPUs of telemetry each), every node once per
``--interval`` seconds: nodes / interval heartbeats a second in all, paced in paced.lua by a delay between a
connection's response and its next request (the installed wrk has no -R). A first cycle of ``--interval``
seconds, every node's first heartbeat (its GPU rows created), is a warm-up and not counted; then
``--seconds`` are measured. During them, threads of this process:

- run the liveness sweep every ``MODELFORGE_LIVENESS_SWEEP_INTERVAL`` seconds and telemetry sampling every
  ``--sample-every`` seconds (the same functions the Celery tasks nodes.sweep_liveness and
  observability.sample run; called directly, not through a worker, and timed with their thread's CPU);
- fetch the dashboard's pages as a logged-in staff user through the web processes, alternating between
  them, every ``--page-every`` seconds: Overview, Nodes, a node's page, its telemetry page, Clusters.

Prints heartbeats offered / sent / recorded per second, wrk's p50 / p99, the sweep's and sampling's
durations, page times, the CPU of each process as a share of one core and the machine's idle share,
Redis memory before and after (per node), and table sizes per node. Loopback only, bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import start_web, throwaway_stack

# bench/heartbeats/run.py's helpers (its module is also called run: loaded by path).
_spec = importlib.util.spec_from_file_location(
    "heartbeats_run", Path(__file__).parents[1] / "heartbeats" / "run.py"
)
assert _spec is not None and _spec.loader is not None
heartbeats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(heartbeats)
cpu_seconds, family, report_body = heartbeats.cpu_seconds, heartbeats.family, heartbeats.report_body

WEB_PORTS = (56810, 56811)
PG_PORT, REDIS_PORT = 56812, 56813
PAGES = ("overview", "nodes", "node", "node telemetry", "clusters")


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return float(sum(fields) - idle), float(sum(fields))


def wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn on {port} did not start") from None
            time.sleep(0.3)


def redis_figures(url: str) -> tuple[int, dict[str, int]]:
    """used_memory, and the number of keys under each ``modelforge:<a>:<b>`` prefix (Celery's own apart)."""
    import redis

    client = redis.Redis.from_url(url)
    used = int(client.info("memory")["used_memory"])
    prefixes: dict[str, int] = {}
    for key in client.scan_iter(count=1000):
        name = key.decode(errors="replace")
        prefix = ":".join(name.split(":")[:3]) if name.startswith("modelforge:") else name.split(":")[0]
        prefixes[prefix] = prefixes.get(prefix, 0) + 1
    client.close()
    return used, prefixes


def stop_groups(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to the process group of each one still running."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--interval", type=float, default=10.0, help="each node's heartbeat interval, s")
    parser.add_argument("--seconds", type=int, default=30, help="measured load, after one warm-up cycle")
    parser.add_argument("--connections", type=int, default=100, help="per wrk instance (two of them)")
    parser.add_argument("--sample-every", type=float, default=15.0)
    parser.add_argument("--page-every", type=float, default=3.0)
    args = parser.parse_args()

    webs: list[subprocess.Popen[bytes]] = []
    with throwaway_stack(PG_PORT, REDIS_PORT) as (workdir, env), contextlib.ExitStack() as cleanup:
        cleanup.callback(stop_groups, webs)
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.test import Client

        from apps.nodes.liveness import sweep
        from apps.nodes.models import CREDENTIAL_PREFIX, GPU, Node, NodeEvent, digest
        from apps.observability import sampling
        from apps.observability.models import HostSample, TelemetrySample

        credentials = [CREDENTIAL_PREFIX + secrets.token_urlsafe(24) for _ in range(args.nodes)]
        Node.objects.bulk_create(
            [
                Node(name=f"bench-{i}", accelerator="nvidia", credential_hash=digest(c))
                for i, c in enumerate(credentials)
            ],
            batch_size=2000,
        )
        one_node = str(Node.objects.order_by("name").values_list("id", flat=True).first())
        half = len(credentials) // 2
        (workdir / "a.txt").write_text("\n".join(credentials[:half]) + "\n")
        (workdir / "b.txt").write_text("\n".join(credentials[half:]) + "\n")
        (workdir / "body.json").write_text(json.dumps(report_body(args.gpus)))
        staff = get_user_model().objects.create_superuser("bench", "bench@example.com", secrets.token_hex(16))
        client = Client()
        client.force_login(staff)
        cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        connection.close()
        redis_before, _ = redis_figures(env["MODELFORGE_REDIS_URL"])

        for port in WEB_PORTS:
            webs.append(start_web(env, port, workers=1, pin_core=None))
        for port in WEB_PORTS:
            wait_healthy(port)

        rate = args.nodes / args.interval
        # Each connection of each instance sends rate / 2 / connections a second.
        delay_ms = max(1, round(args.connections / (rate / 2) * 1000))

        def start_wrk(port: int, share: str, seconds: float) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [
                    "wrk",
                    "-t1",
                    f"-c{args.connections}",
                    f"-d{int(seconds)}s",
                    "--timeout",
                    "5s",
                    "-s",
                    str(Path(__file__).with_name("paced.lua")),
                    f"http://127.0.0.1:{port}",
                ],
                env={
                    **env,
                    "BENCH_CREDENTIALS": str(workdir / share),
                    "BENCH_BODY": str(workdir / "body.json"),
                    "BENCH_DELAY_MS": str(delay_ms),
                },
                stdout=subprocess.PIPE,
                text=True,
            )

        def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
            out, _ = proc.communicate()
            line = next(line for line in out.splitlines() if line.startswith("RESULT "))
            return dict(json.loads(line.removeprefix("RESULT ")))

        # Warm-up: one cycle, every node's first heartbeat (its GPU rows created).
        warm = [
            start_wrk(WEB_PORTS[0], "a.txt", args.interval),
            start_wrk(WEB_PORTS[1], "b.txt", args.interval),
        ]
        for proc in warm:
            result(proc)

        data_dir = Path(env["MODELFORGE_HOME"]) / "postgres" / "data"
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
        redis_pids = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
                if b"redis-server" in cmdline and str(REDIS_PORT).encode() in cmdline:
                    redis_pids.append(int(entry.name))

        stop = threading.Event()
        sweeps: list[tuple[float, float]] = []
        samples: list[tuple[float, float, dict[str, int]]] = []
        page_times: dict[str, list[float]] = {page: [] for page in PAGES}
        page_errors: list[str] = []

        def every(period: float, work: Any) -> None:
            next_at = time.monotonic()
            try:
                while not stop.is_set():
                    work()
                    next_at += period
                    stop.wait(max(0.0, next_at - time.monotonic()))
            finally:
                connection.close()

        def one_sweep() -> None:
            wall, cpu = time.perf_counter(), time.thread_time()
            sweep()
            sweeps.append((time.perf_counter() - wall, time.thread_time() - cpu))

        def one_sample() -> None:
            wall, cpu = time.perf_counter(), time.thread_time()
            counts = sampling.sample()
            samples.append((time.perf_counter() - wall, time.thread_time() - cpu, counts))

        rounds = [0]

        def pages() -> None:
            port = WEB_PORTS[rounds[0] % 2]
            rounds[0] += 1
            paths = ("/", "/nodes/", f"/nodes/{one_node}/", f"/observability/nodes/{one_node}/", "/clusters/")
            for page, path in zip(PAGES, paths, strict=True):
                request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Cookie": cookie})
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (http, loopback)
                        response.read()
                        if response.url.rstrip("/").endswith("/login") or "/login/" in response.url:
                            page_errors.append(f"{page}: redirected to login")
                except OSError as exc:
                    page_errors.append(f"{page}: {exc}")
                page_times[page].append((time.perf_counter() - started) * 1000)

        web_pids = [family(w.pid) for w in webs]
        pg_pids = family(postmaster)
        busy_before = machine_busy()
        web_before = [cpu_seconds(p) for p in web_pids]
        pg_before, redis_before_cpu = cpu_seconds(pg_pids), cpu_seconds(redis_pids)
        bench_before = time.process_time()
        started = time.monotonic()
        load = [
            start_wrk(WEB_PORTS[0], "a.txt", args.seconds),
            start_wrk(WEB_PORTS[1], "b.txt", args.seconds),
        ]
        wrk_pids = [p.pid for p in load]
        wrk_before = cpu_seconds(wrk_pids)
        threads = [
            threading.Thread(target=every, args=(settings.LIVENESS_SWEEP_INTERVAL, one_sweep)),
            threading.Thread(target=every, args=(args.sample_every, one_sample)),
            threading.Thread(target=every, args=(args.page_every, pages)),
        ]
        for thread in threads:
            thread.start()
        time.sleep(max(0.0, args.seconds - 0.5))
        wrk_after = cpu_seconds(wrk_pids)
        results = [result(proc) for proc in load]
        load_ended = time.time()
        elapsed = time.monotonic() - started
        stop.set()
        for thread in threads:
            thread.join()
        busy_after = machine_busy()
        web_cpu = [
            sum(cpu_seconds(p).get(pid, 0) - b.get(pid, 0) for pid in b)
            for p, b in zip(web_pids, web_before, strict=True)
        ]
        pg_cpu = sum(cpu_seconds(family(postmaster)).get(pid, 0) - t for pid, t in pg_before.items())
        redis_cpu = sum(cpu_seconds(redis_pids).get(pid, 0) - t for pid, t in redis_before_cpu.items())
        wrk_cpu = sum(wrk_after.get(pid, 0) - t for pid, t in wrk_before.items())
        bench_cpu = time.process_time() - bench_before
        # What the fleet looks like to the control plane: nodes heard from in the load's last interval (each
        # should have been; a heartbeat is answered 200 only once its batch has committed) and nodes not
        # online.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE last_heartbeat_at >= to_timestamp(%s)), "
                "count(*) FILTER (WHERE liveness <> 'online') FROM nodes_node",
                [load_ended - args.interval],
            )
            current, not_online = cursor.fetchone()
        connection.close()
        for web in webs:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(30)
        redis_after, prefixes = redis_figures(env["MODELFORGE_REDIS_URL"])

        sent = sum(r["requests"] for r in results)
        seconds = max(r["seconds"] for r in results)
        print(
            f"scaling: {args.nodes} nodes x {args.gpus} GPUs, heartbeat every {args.interval:g} s, two web "
            f"processes (1 worker each), two wrk x {args.connections} connections (delay {delay_ms} ms), "
            f"{args.seconds} s measured after a {args.interval:g} s warm-up; {os.cpu_count()} cores"
        )
        print(
            f"  heartbeats/s   offered {rate:7.0f}   sent {sent / seconds:7.0f}   "
            f"recorded {current / args.interval:7.0f} (nodes heard in the last {args.interval:g} s of load: "
            f"{current} of {args.nodes}; not online: {not_online})   "
            f"non-2xx {sum(r['non_2xx'] for r in results)}   "
            f"socket errors {sum(r['errors'] for r in results)}"
        )
        print(
            "  latency ms     "
            + "   ".join(
                f"web {i + 1}: p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} max {r['max_ms']:.0f}"
                for i, r in enumerate(results)
            )
        )
        if sweeps:
            walls = [s[0] * 1000 for s in sweeps]
            print(
                f"  sweep          {len(sweeps)} runs every {settings.LIVENESS_SWEEP_INTERVAL} s: "
                f"p50 {statistics.median(walls):.1f} ms  max {max(walls):.1f} ms  "
                f"(bench-thread CPU {statistics.median(s[1] for s in sweeps) * 1000:.1f} ms)"
            )
        if samples:
            walls = [s[0] * 1000 for s in samples]
            print(
                f"  sampling       {len(samples)} runs every {args.sample_every:g} s: p50 "
                f"{statistics.median(walls):.0f} ms  max {max(walls):.0f} ms  (last: {samples[-1][2]})"
            )
        for page in PAGES:
            times = page_times[page]
            if times:
                print(
                    f"  page {page:<15} {len(times)} loads: p50 {statistics.median(times):6.0f} ms  "
                    f"max {max(times):6.0f} ms"
                )
        for error in page_errors[:5]:
            print(f"  page error     {error}")
        machine = (busy_after[0] - busy_before[0]) / (busy_after[1] - busy_before[1])
        print(
            "  CPU, share of one core   "
            + "   ".join(f"web {i + 1} {c / elapsed:.0%}" for i, c in enumerate(web_cpu))
            + f"   PostgreSQL {pg_cpu / elapsed:.0%}   Redis {redis_cpu / elapsed:.0%}   wrk x2 "
            f"{wrk_cpu / elapsed:.0%}   bench (sweep, sampling, pages) {bench_cpu / elapsed:.0%}   "
            f"machine busy {machine:.0%} of {os.cpu_count()} cores"
        )
        print(
            f"  Redis          used_memory {redis_before / 2**20:.2f} MiB before the heartbeats, "
            f"{redis_after / 2**20:.2f} MiB after: "
            f"{(redis_after - redis_before) / args.nodes:.1f} bytes per node"
        )
        print(f"  Redis keys     {json.dumps(dict(sorted(prefixes.items())))}")
        with connection.cursor() as cursor:
            for model in (Node, GPU, NodeEvent, TelemetrySample, HostSample):
                table = model._meta.db_table
                cursor.execute(  # table names from the models, not input
                    f"SELECT pg_total_relation_size('{table}'), pg_relation_size('{table}'), "  # noqa: S608
                    f"count(*) FROM {table}"
                )
                total, heap, rows = cursor.fetchone()
                print(
                    f"  table {table:<32} {rows:8d} rows   {total / 2**20:7.1f} MiB with indexes "
                    f"({heap / 2**20:.1f} heap)   {total / args.nodes:7.0f} bytes per node"
                )
        connection.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
