"""Heartbeat and sweep benchmark: many simulated agents against the web application under gunicorn.

    python bench/heartbeats/run.py [--nodes 2000] [--gpus 8] [--seconds 10] [--connections 64]
                                   [--web-workers 2] [--sweep-nodes 10000]

Starts its own throw-away PostgreSQL 16 and Redis (the embedded stack, in a temporary folder), enrolls
``--nodes`` nodes, runs gunicorn + uvicorn workers on a free port, and drives heartbeats carrying
``--gpus`` GPUs of telemetry each with wrk (each request is a different node's heartbeat). Then it
times one liveness sweep over ``--sweep-nodes`` nodes that are all due to go offline, and one with
nothing due. Prints the figures; loopback only, bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import free_port, start_web, throwaway_stack

GIB = 2**30


def report_body(gpus: int) -> dict:
    return {
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
    args = parser.parse_args()
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

        credentials = [CREDENTIAL_PREFIX + secrets.token_urlsafe(24) for _ in range(args.nodes)]
        Node.objects.bulk_create(
            [
                Node(name=f"bench-{i}", accelerator="nvidia", credential_hash=digest(c))
                for i, c in enumerate(credentials)
            ],
            batch_size=2000,
        )
        (workdir / "credentials.txt").write_text("\n".join(credentials) + "\n")
        (workdir / "body.json").write_text(json.dumps(report_body(args.gpus)))
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
        result = wrk(args.seconds)
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
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(30)
        web = None

        # Sweeps over --sweep-nodes online nodes: none due, 1 % due, all due (a whole-fleet outage).
        from datetime import timedelta

        from django.conf import settings as django_settings
        from django.utils import timezone

        from apps.alerts.models import Alert
        from apps.nodes.models import ListeningClock

        def timed_sweep(due: int, guard: bool = False) -> tuple[float, int]:
            Node.objects.all().delete()
            Alert.objects.all().delete()
            # A control plane that has been listening all along (no gap from the web run above), and the
            # mass-loss guard off unless measured: the transitions' cost is what is timed.
            ListeningClock.objects.all().delete()
            django_settings.LIVENESS_MASS_LOSS_MIN_NODES = 3 if guard else 10**9
            now = timezone.now()
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
                cursor.execute("ANALYZE")
            started = time.perf_counter()
            moved = sweep()
            return (time.perf_counter() - started) * 1000, len(moved.offline)

        print(f"sweep over {args.sweep_nodes} online nodes (each moved node gets its event row and alert)")
        for label, due, guard in (
            ("nothing due", 0, False),
            ("1 % due", args.sweep_nodes // 100, False),
            ("all due", args.sweep_nodes, False),
            ("all due, held", args.sweep_nodes, True),  # the mass-loss guard: counted, nothing moved
        ):
            runs = [timed_sweep(due, guard) for _ in range(3)]
            print(
                f"  {label:<15}{statistics.median(ms for ms, _ in runs):8.1f} ms  (median of 3; "
                f"{runs[0][1]} moved to offline)"
            )
        connection.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
