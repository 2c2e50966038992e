"""Whole 1-GPU decisions, interleaved in one process on one fleet: the reference ranking statement
(``_ranking(gpus=True, single=True)``, the shape of 7adb377) against ``_RANK_ONE_GPU``.

    python bench/placement/ab_one_gpu.py [--nodes 1000,5000] [--rounds 6] [--block 10]

Blocks of ``--block`` decisions alternate between the two statements (the order flips every round),
so reservations accumulate alike for both; prints each one's median and the per-block medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import throwaway_stack

GIB = 2**30


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=10)
    args = parser.parse_args()
    with throwaway_stack():
        from django.db import connection
        from django.utils import timezone

        from apps.nodes.models import GPU, Node
        from apps.servers import scheduler
        from apps.servers.models import ModelServer
        from apps.servers.scheduler import Request, place

        reference = scheduler._ranking(gpus=True, single=True)
        statements = {
            "reference": {True: reference, False: reference},
            "one-gpu": dict(scheduler._RANK_ONE_GPU),
        }

        def request(name: str) -> Request:
            return Request(name=name, profile="test-echo-gpu", model="m", gpus=1, weights_bytes=8 * GIB)

        for count in (int(n) for n in args.nodes.split(",")):
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
                    for g in range(8)
                ],
                batch_size=5000,
            )
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
            timings: dict[str, list[float]] = {name: [] for name in statements}
            blocks: dict[str, list[float]] = {name: [] for name in statements}
            for name in statements:
                scheduler._RANK_ONE_GPU = statements[name]
                place(request(f"warm-{name}"))
            for r in range(args.rounds):
                for name in list(statements)[:: 1 if r % 2 == 0 else -1]:
                    scheduler._RANK_ONE_GPU = statements[name]
                    block = []
                    for i in range(args.block):
                        started = time.perf_counter()
                        place(request(f"{name}-{r}-{i}"))
                        block.append((time.perf_counter() - started) * 1000)
                    timings[name] += block
                    blocks[name].append(statistics.median(block))
            scheduler._RANK_ONE_GPU = statements["one-gpu"]
            for name in statements:
                per_block = " / ".join(f"{b:.1f}" for b in blocks[name])
                print(
                    f"{count} nodes, 1-GPU, {name:9}: median {statistics.median(timings[name]):6.2f} ms "
                    f"over {len(timings[name])} decisions; per block {per_block}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
