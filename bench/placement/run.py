"""Placement benchmark: one scheduling decision over a large fleet.

    python bench/placement/run.py [--nodes 1000] [--gpus 8] [--decisions 50]

Enrolls ``--nodes`` online nodes with ``--gpus`` GPUs each (fresh heartbeats, varied use), then times
``--decisions`` placements of a 1-GPU server (each one a real decision: lock, headroom, choose,
reserve, record) and counts the SQL statements of one decision at 10 nodes and at ``--nodes`` nodes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import interpreter, throwaway_stack

GIB = 2**30


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--decisions", type=int, default=50)
    args = parser.parse_args()
    print(f"interpreter: {interpreter()}")
    with throwaway_stack():
        from django.db import connection, transaction
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from apps.nodes.models import GPU, Node
        from apps.servers.models import ModelServer
        from apps.servers.scheduler import Request, place

        def fleet(count: int) -> None:
            ModelServer.objects.all().delete()
            Node.objects.all().delete()
            now = timezone.now()
            nodes = Node.objects.bulk_create(
                [
                    Node(
                        name=f"n{i:05d}",
                        accelerator="nvidia",
                        credential_hash=f"{i:064x}",
                        liveness="online",
                        last_heartbeat_at=now,
                        shm_total_bytes=64 * GIB,
                        # Placement refuses a node that does not report the model (model_not_present_on_node).
                        models_present=[{"name": "m"}],
                    )
                    for i in range(count)
                ],
                batch_size=2000,
            )
            GPU.objects.bulk_create(
                [
                    GPU(
                        node=node,
                        index=g,
                        uuid=f"GPU-{i}-{g}",
                        name="H100",
                        memory_total_bytes=80 * GIB,
                        memory_used_bytes=((i * 7 + g * 13) % 70) * GIB,
                        memory_managed_bytes=0,
                        utilization_percent=10,
                        temperature_c=50,
                        reported_at=now,
                    )
                    for i, node in enumerate(nodes)
                    for g in range(args.gpus)
                ],
                batch_size=5000,
            )
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")

        def request(name: str, wanted: int = 1) -> Request:
            return Request(
                name=name, profile="test-echo-gpu", model="m", gpus=wanted, weights_bytes=8 * GIB * wanted
            )

        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE bench_floor (x int)")
        query_counts = {}
        for count in (10, args.nodes):
            fleet(count)
            place(request("warm"))
            with CaptureQueriesContext(connection) as captured:
                place(request("counted"))
            query_counts[count] = len(captured.captured_queries)

        print(f"placement over {args.nodes} nodes x {args.gpus} GPUs ({args.decisions} decisions each)")
        for wanted in (1, 4):
            timings = []
            for i in range(args.decisions):
                started = time.perf_counter()
                place(request(f"s{wanted}-{i}", wanted))
                timings.append((time.perf_counter() - started) * 1000)
            timings.sort()
            print(
                f"  {wanted}-GPU server   median {statistics.median(timings):6.1f} ms   "
                f"p95 {timings[int(len(timings) * 0.95) - 1]:6.1f} ms"
            )
        counts = f"{query_counts[10]} at 10 nodes, {query_counts[args.nodes]} at {args.nodes}"
        print(f"  queries per decision: {counts}")
        # The database's floor: as many trivial round trips as a 1-GPU decision makes, in one transaction
        # on the same connection, and the same with one row written (a commit that waits for the WAL).
        # The count includes BEGIN and COMMIT, which the transaction sends itself.
        statements = query_counts[args.nodes]
        for label, write in (("SELECT 1", False), ("SELECT 1, the last an INSERT", True)):
            floor = []
            for _ in range(args.decisions):
                started = time.perf_counter()
                with transaction.atomic(), connection.cursor() as cursor:
                    for _ in range(statements - 2 - write):
                        cursor.execute("SELECT 1")
                        cursor.fetchall()
                    if write:
                        cursor.execute("INSERT INTO bench_floor VALUES (1)")
                floor.append((time.perf_counter() - started) * 1000)
            what = f"BEGIN, {label} x {statements - 2}, COMMIT"
            print(f"  ceiling: {what:<46} median {statistics.median(floor):6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
