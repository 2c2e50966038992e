"""What an idle gateway costs: the web process's CPU per second with no request, and the wakeups behind it.

    python bench/gateway/idle.py [--seconds 60] [--backends 1] [--settle 10] [--py-spy PATH]

A throw-away PostgreSQL 16 + Redis, ``--backends`` fake backends (backend.py, each a running server of
one cluster serving chat.general@1 and rag.embedding@1, as engine.py routes llama.cpp), the web
application under gunicorn (one uvicorn worker, pinned to core 0). After one request through the gateway
(so the routing table, the prober and the counters' flush all run) and ``--settle`` seconds, it reads
the CPU time of the web process group over ``--seconds`` seconds of quiet, from /proc: gunicorn's
arbiter and its worker, and the embedded PostgreSQL's and Redis's CPU over the same seconds (what the
gateway's background statements and commands cost them). With ``--py-spy PATH`` (py-spy on PATH or
given) it also records where the worker's idle CPU goes, as py-spy's raw collapsed stacks, and prints
the top functions by own samples.

Why it matters: LLM traffic is slow, and the gateway shares a core with the engine in the real-engine
bench (engine.py): every millisecond a second the idle gateway spends is a millisecond an engine's
answer can wait (bench/gateway/README.md, 2026-12-04).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import PYTHON, free_port, route_to_backends, start_web, throwaway_stack, wait_http
from run import group_pids


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--backends", type=int, default=1)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--py-spy", dest="py_spy", default=None, help="py-spy executable: profile the worker")
    args = parser.parse_args()

    here = Path(__file__).resolve().parent
    with throwaway_stack() as (workdir, env):
        from apps.clusters.models import ClientCredential

        ports = {f"idle-{i}": free_port() for i in range(args.backends)}
        backends = [
            subprocess.Popen(
                [PYTHON, "-m", "uvicorn", "backend:app", "--port", str(port), "--log-level", "warning"],
                cwd=here,
                start_new_session=True,
            )
            for port in ports.values()
        ]
        web = None
        try:
            for port in ports.values():
                wait_http(f"http://127.0.0.1:{port}/health")
            route_to_backends("127.0.0.1", ports)
            _, key = ClientCredential.objects.mint(name="idle", scopes=["chat.general@1"])
            gateway_port = free_port()
            web = start_web(env, gateway_port)
            wait_http(f"http://127.0.0.1:{gateway_port}/health")
            import httpx

            deadline = time.monotonic() + 30
            while True:  # the first answer: the table built, the backends probed
                answer = httpx.post(
                    f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                    json={"model": "chat.general@1", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=10,
                )
                if answer.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if answer.status_code != 200:
                raise SystemExit(f"the gateway did not answer: {answer.status_code} {answer.text[:200]}")
            time.sleep(args.settle)

            home = workdir / "home"
            postmaster = int((home / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
            redis_pid = int((home / "redis" / "redis.pid").read_text().strip())
            web_pids = group_pids(web.pid)
            worker = [pid for pid in web_pids if pid != web.pid]
            spy = None
            if args.py_spy and worker:
                raw = workdir / "idle.txt"
                spy = subprocess.Popen(
                    [
                        args.py_spy,
                        "record",
                        "--pid",
                        str(worker[0]),
                        "--duration",
                        str(int(args.seconds)),
                        "--rate",
                        "1000",
                        "--format",
                        "raw",
                        "--output",
                        str(raw),
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            threads_before = _thread_cpu(worker[0]) if worker else {}
            database_before = _database_counts()
            before = (
                _cpu([web.pid]),
                _cpu(worker),
                _postgres_cpu(postmaster),
                _cpu([redis_pid]),
            )
            started = time.monotonic()
            time.sleep(args.seconds)
            elapsed = time.monotonic() - started
            after = (
                _cpu([web.pid]),
                _cpu(worker),
                _postgres_cpu(postmaster),
                _cpu([redis_pid]),
            )
            names = (
                "gunicorn arbiter",
                "web worker (the gateway)",
                "PostgreSQL (all its processes)",
                "Redis",
            )
            print(f"idle for {elapsed:.1f} s, {args.backends} backend(s), CPU per second of quiet:")
            for name, b, a in zip(names, before, after, strict=True):
                print(f"  {name:34} {1000 * (a - b) / elapsed:6.2f} ms/s")
            print(f"  {'total':34} {1000 * (sum(after) - sum(before)) / elapsed:6.2f} ms/s")
            database_after = _database_counts()
            print(
                "PostgreSQL, per second of quiet: "
                + ", ".join(
                    f"{name} {(after_n - before_n) / elapsed:.1f}"
                    for name, before_n, after_n in zip(
                        ("transactions", "rows read", "rows updated", "connections made"),
                        database_before,
                        database_after,
                        strict=True,
                    )
                )
                + " (this bench's own two reads included)"
            )
            if worker:
                names_of = _thread_names(args.py_spy, worker[0]) if args.py_spy else {}
                print("the web worker's threads:")
                for tid, cpu in sorted(_thread_cpu(worker[0]).items()):
                    spent = cpu - threads_before.get(tid, 0.0)
                    if spent > 0:
                        print(f"  {names_of.get(tid, str(tid)):34} {1000 * spent / elapsed:6.2f} ms/s")
            if spy is not None:
                spy.wait(timeout=args.seconds + 60)
                _top(workdir / "idle.txt")
        finally:
            if web is not None:
                os.killpg(web.pid, signal.SIGTERM)
                web.wait(timeout=20)
            for backend in backends:
                os.killpg(backend.pid, signal.SIGTERM)
                backend.wait(timeout=20)


def _database_counts() -> tuple[int, ...]:
    """The database's transactions, rows read and updated, and sessions made so far (pg_stat_database;
    the statistics collector's counts, as of this transaction)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback, tup_fetched + tup_returned, tup_updated, sessions"
            " FROM pg_stat_database WHERE datname = current_database()"
        )
        return tuple(int(v) for v in cursor.fetchone())


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid``, by thread id, to the nanosecond (/proc's schedstat: the
    stat file's ticks of 10 ms are too coarse for a few milliseconds a second)."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except OSError:
            continue
    return found


def _cpu(pids: list[int]) -> float:
    """CPU seconds of ``pids`` and all their threads (schedstat)."""
    return sum(sum(_thread_cpu(pid).values()) for pid in pids if Path(f"/proc/{pid}").exists())


def _thread_names(py_spy: str, pid: int) -> dict[int, str]:
    """Python's names of ``pid``'s threads, by thread id (``py-spy dump``)."""
    dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=False)
    names = {}
    for line in dump.stdout.splitlines():
        # Thread 10620 (idle): "MainThread"
        if line.startswith("Thread ") and '"' in line:
            ident = line.split()[1]
            with contextlib.suppress(ValueError):
                names[int(ident, 0)] = line.split('"')[1]
    return names


def _postgres_cpu(postmaster: int) -> float:
    """CPU seconds of PostgreSQL: the postmaster's own and its finished children's (a new connection's
    backend lives a moment: /proc's cutime keeps it), and its live children's, in /proc's ticks."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / ticks
    for pid in _descendants(postmaster)[1:]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children[ppid].append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _top(raw: Path, n: int = 25) -> None:
    """The functions with the most samples anywhere in their stack (inclusive), from py-spy's raw output;
    idle waits (select, epoll) excluded from the total."""
    if not raw.exists():
        print("py-spy wrote nothing")
        return
    inclusive: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        total += int(samples)
        leaves[frames[-1]] += int(samples)
        for frame in set(frames):
            inclusive[frame] += int(samples)
    print(f"py-spy: {total} samples on CPU (at 1,000/s); ModelForge's functions, inclusive:")
    ours = [
        (frame, count) for frame, count in inclusive.items() if "(apps/" in frame or "(modelforge/" in frame
    ]
    for frame, count in sorted(ours, key=lambda item: -item[1])[:n]:
        print(f"  {count:6d}  {frame[:150]}")
    print("by leaf function (own samples):")
    for frame, count in leaves.most_common(n):
        print(f"  {count:6d}  {frame[:150]}")


if __name__ == "__main__":
    main()
