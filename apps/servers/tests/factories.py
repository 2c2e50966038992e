"""Nodes with GPUs in a known state, for placement tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.nodes.tests.factories import GIB, beat, gpu_report, heartbeat_report, make_node
from apps.servers.scheduler import Request

# The models the placement tests ask for: a server is only placed where its model is present (seeds: "A
# remote start is refused outright"), so every test node holds these unless a test says otherwise.
TEST_MODELS = ("m", "m1", "m2", "gemma")


def gpu_node(
    name: str,
    gpus: list[tuple[int, int, int]],
    *,
    models: Sequence[str] = TEST_MODELS,
    shm_gib: int = 16,
    **fields: Any,
):
    """A node that just reported ``gpus`` as (total GiB, used GiB, managed GiB) each."""
    node, credential = make_node(name=name, **fields)
    report = heartbeat_report()
    report["gpus"] = [
        gpu_report(i, total=t * GIB, used=u * GIB, managed=m * GIB) for i, (t, u, m) in enumerate(gpus)
    ]
    report["shm"] = {"total_bytes": shm_gib * GIB, "free_bytes": shm_gib * GIB}
    report["models_present"] = [{"name": m, "kind": "weights_directory"} for m in models]
    beat(credential, report)
    node.refresh_from_db()
    return node


def cpu_node(name: str, *, available_gib: int = 32, models: Sequence[str] = TEST_MODELS, **fields: Any):
    node, credential = make_node(name=name, accelerator="cpu", **fields)
    report = heartbeat_report(gpus=0)
    report["memory"] = {"total_bytes": 64 * GIB, "available_bytes": available_gib * GIB}
    report["models_present"] = [{"name": m, "kind": "weights_directory"} for m in models]
    beat(credential, report)
    node.refresh_from_db()
    return node


def gpu_request(name: str = "srv", gpus: int = 1, weights_gib: float = 4, **kw: Any) -> Request:
    # test-echo-gpu: 1.2 x weights per GPU + 1 GiB; 4 GiB of weights on 1 GPU -> 5.8 GiB
    return Request(
        name=name,
        profile="test-echo-gpu",
        model=kw.pop("model", "m1"),
        gpus=gpus,
        weights_bytes=int(weights_gib * GIB),
        **kw,
    )
