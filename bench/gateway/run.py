"""Gateway benchmark: the gateway against calling the backend directly, on this machine.

    python bench/gateway/run.py [--seconds 8] [--conns 8,32,64] [--workloads embeddings,chat,stream]

A throw-away PostgreSQL 16 + Redis, one backend (bench/gateway/backend.py under uvicorn) registered as a
running model server in a cluster serving rag.embedding@1 and chat.general@1, a client credential, and
the web application under gunicorn (1 uvicorn worker). Backend and gateway are pinned to core 0, wrk
to core 1, so "gateway" rows are backend + gateway sharing one core. For each workload and connection
count: requests/s, p50/p99 latency (wrk; for streams, to the last chunk), the gateway's own CPU per
request (from /proc), the Redis server's CPU per request (the limit script runs there; it shares the
machine's two cores), and the time to the first streamed chunk (a separate sequential client).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import PYTHON, free_port, interpreter, route_to_one_backend, start_web, throwaway_stack, wait_http

HERE = Path(__file__).resolve().parent
PYSPY = str(Path(PYTHON).with_name("py-spy"))  # the dev extra's sampling profiler, for --profile
TICKS = os.sysconf("SC_CLK_TCK")
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "embeddings": ("/v1/embeddings", {"model": "rag.embedding@1", "input": "The quick brown fox."}),
    "chat": (
        "/v1/chat/completions",
        {"model": "chat.general@1", "messages": [{"role": "user", "content": "Hi"}]},
    ),
    "stream": (
        "/v1/chat/completions",
        {"model": "chat.general@1", "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    ),
}


def backend_argv(port: int) -> list[str]:
    """The fake backend (backend.py, run from this folder) under uvicorn on 127.0.0.1:``port``."""
    options = ["--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log"]
    return [PYTHON, "-m", "uvicorn", "backend:app", "--port", str(port), *options]


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def switches(pids: list[int]) -> int:
    """Context switches of ``pids`` so far, voluntary and involuntary (every thread's, from /proc)."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                status = Path(f"/proc/{pid}/task/{task}/status").read_text()
            except OSError:
                continue
            total += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return total


def group_pids(leader: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == leader]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def wrk(url: str, body: dict[str, Any], auth: str, conns: int, seconds: int) -> dict:
    env = {**os.environ, "BENCH_BODY": json.dumps(body), "BENCH_AUTH": auth}
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{seconds}s",
            "--timeout",
            "5s",
            "-s",
            str(HERE / "post.lua"),
            url,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def first_chunk_ms(url: str, body: dict[str, Any], auth: str, count: int = 50) -> float:
    headers = {"Authorization": f"Bearer {auth}"} if auth else {}
    samples = []
    with httpx.Client(timeout=10) as client:
        for _ in range(count):
            started = time.perf_counter()
            with client.stream("POST", url, json=body, headers=headers) as response:
                first = None
                for _chunk in response.iter_raw():
                    if first is None:
                        first = (time.perf_counter() - started) * 1000
                samples.append(first or 0.0)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--conns", default="8,32,64")
    parser.add_argument("--workloads", default="embeddings,chat,stream")
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="sample the gateway worker with py-spy during the first gateway row (collapsed stacks to PATH)",
    )
    parser.add_argument(
        "--profile-limits",
        action="store_true",
        help="with --profile and --limits: sample the first row with limits instead",
    )
    parser.add_argument(
        "--limits",
        action="store_true",
        help="add a row per workload for a credential with limits (set high: every call runs the limit "
        "script, none is refused), in the same run as the rows without",
    )
    parser.add_argument(
        "--backend-batch",
        action="store_true",
        help="diagnostic, not the bench's figure: run the backend SCHED_BATCH, so its wake-ups do not "
        "preempt the gateway on their shared core (shows what the two processes' context switching costs)",
    )
    parser.add_argument(
        "--redis-commands",
        action="store_true",
        help="print how many of each Redis command the run made (EVALSHA: the limit script's calls)",
    )
    args = parser.parse_args()
    conns = [int(c) for c in args.conns.split(",")]
    workloads = args.workloads.split(",")
    processes: list[subprocess.Popen[bytes]] = []
    with throwaway_stack() as (workdir, env):
        from apps.clusters.models import ClientCredential

        redis_pid = int((workdir / "home" / "redis" / "redis.pid").read_text().strip())

        backend_port, gateway_port = free_port(), free_port()
        route_to_one_backend("127.0.0.1", backend_port)
        _, key = ClientCredential.objects.mint(name="bench", scopes=["rag.embedding@1", "chat.general@1"])
        _, limited_key = ClientCredential.objects.mint(
            name="bench-limited",
            scopes=["rag.embedding@1", "chat.general@1"],
            limits={
                "requests_per_minute": 10**9,
                "tokens_per_minute": 10**15,
                "max_concurrent": 10**6,
                "tokens_per_day": 10**15,
                "tokens_per_month": 10**15,
            },
        )
        try:
            backend = subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    "0",
                    *backend_argv(backend_port),
                ],
                cwd=HERE,
                env=env,
                start_new_session=True,
            )
            processes.append(backend)
            if args.backend_batch:  # taskset execs the backend: this pid is uvicorn's own
                os.sched_setscheduler(backend.pid, os.SCHED_BATCH, os.sched_param(0))
            gateway = start_web(env, gateway_port)
            processes.append(gateway)
            wait_http(f"http://127.0.0.1:{backend_port}/health")
            wait_http(f"http://127.0.0.1:{gateway_port}/healthz")
            direct, through = f"http://127.0.0.1:{backend_port}", f"http://127.0.0.1:{gateway_port}"
            path, body = BODIES["embeddings"]
            wrk(through + path, body, key, 8, 2)  # warm-up: pools, routing table, prepared state
            if args.limits:
                wrk(through + path, body, limited_key, 8, 1)
            rows: list[tuple[Any, ...]] = []
            for workload in workloads:
                path, body = BODIES[workload]
                for n in conns:
                    result = {}
                    targets = [("direct", direct, ""), ("gateway", through, key)]
                    if args.limits:
                        targets.append(("gateway+limits", through, limited_key))
                    for target, base, auth in targets:
                        gateway_pids = group_pids(gateway.pid)
                        before = cpu_seconds(gateway_pids)
                        redis_before = cpu_seconds([redis_pid])
                        backend_before = cpu_seconds([backend.pid])
                        core0 = [backend.pid, *gateway_pids]
                        switched_before = switches(core0)
                        sampler = None
                        profiled = "gateway+limits" if args.profile_limits else "gateway"
                        if args.profile and target == profiled and not rows:
                            worker = max(set(group_pids(gateway.pid)) - {gateway.pid})
                            sampling = ["--format", "raw", "--nonblocking", "--rate", "500"]
                            sampling += ["--duration", str(args.seconds), "-o", args.profile]
                            sampler = subprocess.Popen(
                                [PYSPY, "record", "--pid", str(worker), *sampling],
                                stdout=subprocess.DEVNULL,
                            )
                        measured = wrk(base + path, body, auth, n, args.seconds)
                        if sampler is not None:
                            sampler.wait(30)
                        used = cpu_seconds(group_pids(gateway.pid)) - before
                        result[target] = (
                            measured,
                            used,
                            cpu_seconds([redis_pid]) - redis_before,
                            cpu_seconds([backend.pid]) - backend_before,
                            switches(core0) - switched_before,
                        )
                    d, _, _, d_backend, d_switches = result["direct"]
                    rps_d = d["requests"] / d["seconds"]
                    for target in [t for t, _, _ in targets if t != "direct"]:
                        g, g_cpu, redis_cpu, g_backend, g_switches = result[target]
                        rows.append(
                            (
                                workload if target == "gateway" else f"{workload} (limits)",
                                n,
                                rps_d,
                                g["requests"] / g["seconds"],
                                d["p50_us"],
                                g["p50_us"],
                                d["p99_us"],
                                g["p99_us"],
                                g_cpu / max(g["requests"], 1) * 1e6,
                                redis_cpu / max(g["requests"], 1) * 1e6,
                                d_backend / max(d["requests"], 1) * 1e6,
                                g_backend / max(g["requests"], 1) * 1e6,
                                d_switches / max(d["requests"], 1),
                                g_switches / max(g["requests"], 1),
                                d["errors"] + g["errors"],
                            )
                        )
            if args.redis_commands:
                import redis
                from django.conf import settings

                stats = redis.Redis.from_url(settings.CELERY_BROKER_URL).info("commandstats")
                calls = {
                    name.removeprefix("cmdstat_"): f"{v['calls']} calls, {v['usec'] / 1000:,.0f} ms"
                    for name, v in stats.items()
                }
                print("Redis commands in the run (with the script's own):", dict(sorted(calls.items())))
            print(f"interpreter: {interpreter()}")
            print(
                "| workload | conns | direct rps | gateway rps | direct p50 | gateway p50 | added p50 | "
                "gateway p99 | gateway CPU/req | Redis CPU/req | backend CPU/req | core-0 switches/req | "
                "errors |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for w, n, rd, rg, pd, pg, _qd, qg, cpu, rcpu, bd, bg, sd, sg, errs in rows:
                print(
                    f"| {w} | {n} | {rd:,.0f} | {rg:,.0f} | {pd / 1000:.2f} ms | {pg / 1000:.2f} ms | "
                    f"{(pg - pd) / 1000:+.2f} ms | {qg / 1000:.2f} ms | {cpu:,.0f} µs | {rcpu:,.0f} µs | "
                    f"{bd:,.0f} → {bg:,.0f} µs | {sd:.2f} → {sg:.2f} | {errs} |"
                )
            if args.backend_batch:
                print("\n(diagnostic: the backend ran SCHED_BATCH; these are not the bench's figures)")
            if "stream" in workloads:
                path, body = BODIES["stream"]
                ttfc_d = first_chunk_ms(direct + path, body, "")
                ttfc_g = first_chunk_ms(through + path, body, key)
                print(
                    f"\ntime to first chunk (median of 50, sequential): direct {ttfc_d:.2f} ms, "
                    f"gateway {ttfc_g:.2f} ms, added {ttfc_g - ttfc_d:+.2f} ms"
                )
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
