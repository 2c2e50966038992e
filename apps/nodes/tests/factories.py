"""Small factories: each makes exactly one object, relations explicit."""

from __future__ import annotations

import json
import secrets
from typing import Any

from django.utils import timezone

from apps.nodes.heartbeat import parse_report, record_heartbeat
from apps.nodes.models import CREDENTIAL_PREFIX, Node, digest

GIB = 2**30


def make_node(name: str = "node-1", **fields: Any) -> tuple[Node, str]:
    """A node enrolled directly (no token), with its plain credential."""
    credential = CREDENTIAL_PREFIX + secrets.token_urlsafe(24)
    fields.setdefault("accelerator", "nvidia")
    node = Node.objects.create(name=name, credential_hash=digest(credential), **fields)
    return node, credential


def gpu_report(
    index: int = 0, *, total: int = 24 * GIB, used: int = 6 * GIB, managed: int = 2 * GIB
) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        "name": "NVIDIA RTX 4090",
        "memory_total_bytes": total,
        "memory_used_bytes": used,
        "memory_managed_bytes": managed,
        "utilization_percent": 37,
        "temperature_c": 61,
    }


def heartbeat_report(gpus: int = 2, **overrides: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "agent_version": "0.1.0",
        "accelerator": "nvidia" if gpus else "cpu",
        "agent_url": "http://10.0.0.5:8471",
        "cpu": {"count": 16, "load_1m": 0.5},
        "memory": {"total_bytes": 64 * GIB, "available_bytes": 40 * GIB},
        "shm": {"total_bytes": 8 * GIB, "free_bytes": 8 * GIB},
        "gpus": [gpu_report(i) for i in range(gpus)],
        "models_present": [{"name": "bge-small", "kind": "weights_directory"}],
    }
    report.update(overrides)
    return report


def beat(credential: str, report: dict[str, Any] | None = None) -> tuple[str, bool, str] | None:
    """Record a heartbeat in-process at the current (possibly travelled) time, through the same
    validation and statement as the HTTP endpoint."""
    parsed = parse_report(json.dumps(report or heartbeat_report()).encode())
    return record_heartbeat(credential, parsed, timezone.now())
