"""The load-balancer card of a cluster (configured share against actual share per member, drift, the
reasons), as the dashboard and the API show it.

The gateway computes it from what it counted (apps/gateway/loadbalancer.py) and registers that here at
ready(): clusters sits below the gateway and never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.clusters.models import Cluster

_reports: list[Callable[[Cluster], dict[str, Any]]] = []
_queue_readers: list[Callable[[], dict[str, int] | None]] = []


def register_report(report: Callable[[Cluster], dict[str, Any]]) -> None:
    """The gateway's card; one per process (a second registration replaces the first)."""
    _reports[:] = [report]


def register_queue_depths(reader: Callable[[], dict[str, int] | None]) -> None:
    """The gateway's admission queues: requests waiting per capability (None: Redis unreadable)."""
    _queue_readers[:] = [reader]


def queue_depths() -> dict[str, int] | None:
    """Requests waiting at the gateway per capability, across its web processes; None when unknown."""
    return _queue_readers[0]() if _queue_readers else None


def cluster_report(cluster: Cluster) -> dict[str, Any]:
    if not _reports:
        raise RuntimeError("no load-balancer card registered: apps.gateway is not installed")
    return _reports[0](cluster)
