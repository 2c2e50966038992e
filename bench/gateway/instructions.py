"""Where the gateway worker's instructions per request go, counted by valgrind's callgrind.

    python bench/gateway/instructions.py [--requests 1000] [--pairs 3] [--workloads embeddings,stream]
                                         [--limits] [--keep DIR]

The web application runs under ``valgrind --tool=callgrind`` (gunicorn, one uvicorn worker) beside the
same backend as ``run.py``; the master starts uninstrumented and is switched on once it is up, so every
worker it forks from then on is counted from its first instruction to its exit, one dump per thread
(``callgrind_control`` cannot reach a forked worker, only the master). The figure is the event loop's
thread (the first), where requests are served; the worker's other threads (the routing table's
refresher, the apps' checks) tick by the clock.

A row is the difference of two worker lives, a pair: each life is warmed up (``WARM`` requests: pools,
routing table), then one makes ``--requests`` requests one after another over one keep-alive connection
and the other ``FEW``, then waits until it has lived as long. Instructions per request = (longer life -
shorter life) / (``--requests`` - ``FEW``); the row gives the median of ``--pairs`` pairs and each pair's
figure. ``--keep DIR`` keeps every life's dumps: ``callgrind_annotate`` on two of them, a longer and a
shorter life, tells which C functions a request spends its instructions in (how the exceptions that
Python 3.11 raises and clears inside ``bytes in bytes`` were found, bench/gateway/README.md 2026-12-06).

What it is not: a figure that settles a change of a few per cent. On the VM it was written on (2026-12-06)
a pair's figure moved by about 6 % around the median, and the stream row has two modes some 40 % apart
(under valgrind the gateway is about fifty times slower than the native backend, and whether an answer's
events arrive in one read or several is timing). Rows with ``--limits`` are not the native path either:
the limiter's timing (credit per quarter second, releases within 2 ms) meets a gateway fifty times
slower. User-space instructions only: the kernel's share (socket writes and reads, about a quarter of the
worker's CPU in ``perf``) is not in it. ``run.py`` remains the bench's latency and CPU figure.

Compare two versions only by runs that alternate (A B B A) with nothing else running on the machine: the
embeddings row has two timing modes too, about 35k instructions apart (some 12 %), and load beside the
bench moves runs between them. A Cython build first looked 15 % cheaper that way, measured beside a
compiler job, and was 2-3 % cheaper alternated on an idle machine (bench/gateway/README.md, 2026-12-07).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import free_port, route_to_one_backend, start_web, throwaway_stack, wait_http
from run import BODIES, backend_argv, group_pids

HERE = Path(__file__).resolve().parent
FEW = 100  # requests in the life that is taken off (the same length, padded with a wait)
WARM = 200  # requests before the counted ones, in every worker life: pools, routing table, credit
LIMITS: dict[str, int | None] = {
    "requests_per_minute": 10**9,
    "tokens_per_minute": 10**15,
    "max_concurrent": 10**6,
    "tokens_per_day": 10**15,
    "tokens_per_month": 10**15,
}


def control(*args: str) -> None:
    out = subprocess.run(["callgrind_control", *args], capture_output=True, text=True)
    if out.returncode or "Error" in out.stdout or "Error" in out.stderr:
        raise SystemExit(f"callgrind_control {' '.join(args)}: {out.stdout}{out.stderr}")


def worker_of(master: int, not_these: set[int]) -> int:
    """The gunicorn worker of ``master`` that is not one of ``not_these``, once it runs."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = set(group_pids(master)) - {master} - not_these
        if pids:
            return max(pids)
        time.sleep(0.2)
    raise SystemExit("the web application started no new worker")


def life(
    master: int, workdir: Path, port: int, gone: set[int], warm: Any, action: Any, keep: Path | None
) -> tuple[int, float]:
    """The next worker (instrumented: forked after the master's instrumentation was switched on): warm
    it up, run ``action``, stop it and read the instructions its dump counted (its dumps copied to
    ``keep``, if given). Returns (instructions, seconds ``action`` took)."""
    worker = worker_of(master, gone)
    wait_http(f"http://127.0.0.1:{port}/healthz", seconds=300)
    warm()
    started = time.monotonic()
    action()
    seconds = time.monotonic() - started
    stop(worker)
    gone.add(worker)
    # One dump per thread (--separate-threads): the event loop's thread (the first: the one gunicorn forked
    # from) serves every request; the others (the routing table's refresher, the apps' checks) tick by the
    # clock and now and then spend 150 million instructions at once, which only the noise would count.
    dumps = sorted(workdir.glob(f"callgrind.out.{worker}-*"))
    loop = workdir / f"callgrind.out.{worker}-01"
    text = loop.read_text(errors="replace")
    match = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if match is None:
        raise SystemExit(f"no totals in {loop}")
    for dump in dumps:
        if keep is not None:
            shutil.copy(dump, keep)  # to read with callgrind_annotate
        dump.unlink()
    return int(match.group(1)), seconds


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise SystemExit(f"worker {pid} did not stop")


def requester(port: int, path: str, body: dict[str, Any], key: str, count: int) -> Any:
    payload = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(count):
            conn.request("POST", path, payload, headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"the gateway answered {response.status} on {path}")
        conn.close()

    return run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000, help="requests in the longer life of a pair")
    parser.add_argument(
        "--keep", metavar="DIR", type=Path, help="copy each worker life's callgrind dump here"
    )
    parser.add_argument("--pairs", type=int, default=3, help="pairs of worker lives per row (the median)")
    parser.add_argument("--workloads", default="embeddings,stream")
    parser.add_argument(
        "--limits",
        action="store_true",
        help="add a row per workload for a credential with limits (one request at a time under valgrind is "
        "slower than the limits' timing assumes: their figure is not the native path's, see the README)",
    )
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    with throwaway_stack() as (workdir, env):
        from apps.clusters.models import ClientCredential

        backend_port, gateway_port = free_port(), free_port()
        route_to_one_backend("127.0.0.1", backend_port)
        scopes = ["rag.embedding@1", "chat.general@1"]
        _, key = ClientCredential.objects.mint(name="bench", scopes=scopes)
        _, limited_key = ClientCredential.objects.mint(name="bench-limited", scopes=scopes, limits=LIMITS)
        try:
            backend = subprocess.Popen(
                backend_argv(backend_port),
                cwd=HERE,
                env=env,
                start_new_session=True,
            )
            processes.append(backend)
            valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no"]
            valgrind += [
                f"--callgrind-out-file={workdir}/callgrind.out.%p",
                "--separate-threads=yes",
                "--quiet",
            ]
            gateway = start_web(env, gateway_port, pin_core=None, prefix=valgrind)
            processes.append(gateway)
            wait_http(f"http://127.0.0.1:{backend_port}/health")
            wait_http(f"http://127.0.0.1:{gateway_port}/healthz", seconds=300)
            first = worker_of(gateway.pid, set())
            control("-i", "on", str(gateway.pid))  # the workers forked from now on are counted
            stop(first)
            gone = {first}
            for dump in workdir.glob(f"callgrind.out.{first}-*"):
                dump.unlink()
            print(
                f"gateway worker instructions per request: {args.pairs} pairs of worker lives a row, "
                f"{args.requests} and {FEW} sequential requests"
            )
            print("| workload | instructions/request, median | pairs |")
            print("|---|---:|---|")
            for workload in workloads:
                path, body = BODIES[workload]
                rows = [(workload, key)] + ([(f"{workload} (limits)", limited_key)] if args.limits else [])
                for label, credential in rows:
                    warm = requester(gateway_port, path, body, credential, WARM)
                    few = requester(gateway_port, path, body, credential, FEW)
                    many = requester(gateway_port, path, body, credential, args.requests)
                    figures = []
                    lived = functools.partial(life, gateway.pid, workdir, gateway_port, gone, keep=args.keep)
                    for _ in range(args.pairs):
                        with_many, seconds = lived(warm, many)

                        def few_then_wait(seconds: float = seconds, few: Any = few) -> None:
                            started = time.monotonic()
                            few()
                            time.sleep(max(0.0, seconds - (time.monotonic() - started)))

                        with_few, _ = lived(warm, few_then_wait)
                        figures.append((with_many - with_few) / (args.requests - FEW))
                    each = ", ".join(f"{f:,.0f}" for f in figures)
                    print(f"| {label} | {statistics.median(figures):,.0f} | {each} |")
        finally:
            for process in processes:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
