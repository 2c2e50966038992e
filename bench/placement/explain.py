"""Where a placement decision's time goes: EXPLAIN (ANALYZE, BUFFERS) of the ranking statement and the
time of each statement of a decision, over the same fleet as run.py.

    python bench/placement/explain.py [--nodes 1000] [--gpus 8] [--rounds 20] [--plans]

Builds the fleet run.py builds, places ``--rounds`` 1-GPU and 4-GPU servers (so reservations exist, as
in run.py), then for each size prints: the ranking statement's server-side execution and planning time
(median of ``--rounds`` EXPLAIN ANALYZE runs without BUFFERS, which adds its own cost), the round trip of
the statement alone from Python, and per decision the time spent in each statement and outside them.
``--plans`` also prints one EXPLAIN (ANALYZE, BUFFERS) of the ranking statements.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import throwaway_stack

GIB = 2**30


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--plans", action="store_true")
    args = parser.parse_args()
    with throwaway_stack():
        from django.conf import settings
        from django.db import connection
        from django.utils import timezone

        from apps.nodes.models import GPU, Node
        from apps.servers import scheduler
        from apps.servers.choices import HOLDING
        from apps.servers.scheduler import Request, place

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
                    models_present=[{"name": "m"}],
                )
                for i in range(args.nodes)
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

        def request(name: str, wanted: int) -> Request:
            return Request(
                name=name, profile="test-echo-gpu", model="m", gpus=wanted, weights_bytes=8 * GIB * wanted
            )

        def params(wanted: int) -> dict[str, Any]:
            profile = scheduler._profile("test-echo-gpu")
            need, _ = profile.memory_need(8 * GIB * wanted, wanted)
            return {
                "holding": list(HOLDING),
                "fresh_after": timezone.now() - timedelta(seconds=settings.NODE_STALE_AFTER),
                "accelerator": "nvidia",
                "only": None,
                "spread": settings.PLACEMENT_STRATEGY == "spread",
                "need": need,
                "k": wanted,
                "shm": profile.shm_bytes,
                "model": json.dumps([{"name": "m"}]),
                "artifact": None,
                "limit": scheduler.EXPLAIN_RUNNERS_UP + 1,
            }

        # Per statement of a decision: the wrapper sees every statement the decision sends.
        spent: dict[str, list[float]] = defaultdict(list)

        def timer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                key = " ".join(sql.split())[:60]
                spent[key].append((time.perf_counter() - started) * 1000)

        print(f"placement over {args.nodes} nodes x {args.gpus} GPUs, {args.rounds} rounds")
        one_gpu = scheduler._RANK_ONE_GPU[settings.PLACEMENT_STRATEGY == "spread"]  # the ranking place() runs
        for wanted, sql in ((1, one_gpu), (4, scheduler._RANK_GPUS)):
            for i in range(args.rounds):
                place(request(f"warm{wanted}-{i}", wanted))
            decisions = []
            per_decision: list[dict[str, float]] = []
            for i in range(args.rounds):
                spent.clear()
                started = time.perf_counter()
                with connection.execute_wrapper(timer):
                    place(request(f"s{wanted}-{i}", wanted))
                decisions.append((time.perf_counter() - started) * 1000)
                per_decision.append({k: sum(v) for k, v in spent.items()})
            print(f"\n{wanted}-GPU decision: median {statistics.median(decisions):.2f} ms")
            keys = list(per_decision[0])
            for key in keys:
                values = [d.get(key, 0.0) for d in per_decision]
                print(f"  {statistics.median(values):7.2f} ms  {key}")
            outside = [total - sum(d.values()) for total, d in zip(decisions, per_decision, strict=True)]
            print(f"  {statistics.median(outside):7.2f} ms  outside the statements (Python, pool, on_commit)")

            with connection.cursor() as cursor:
                execution, planning, alone = [], [], []
                for _ in range(args.rounds):
                    cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params(wanted))
                    plan = cursor.fetchone()[0]
                    plan = json.loads(plan) if isinstance(plan, str) else plan
                    execution.append(plan[0]["Execution Time"])
                    planning.append(plan[0]["Planning Time"])
                    started = time.perf_counter()
                    cursor.execute(sql, params(wanted))
                    cursor.fetchall()
                    alone.append((time.perf_counter() - started) * 1000)
                print(
                    f"  ranking alone: round trip {statistics.median(alone):.2f} ms; server: planning "
                    f"{statistics.median(planning):.2f} ms, execution {statistics.median(execution):.2f} ms"
                )
                if args.plans:
                    cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params(wanted))
                    print("\n".join(row[0] for row in cursor.fetchall()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
