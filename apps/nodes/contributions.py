"""What nodes contribute to the platform's registries: an invariant over GPU memory, the overview's Fleet
card and the liveness gauge on ``/metrics``. Registered by ``NodesConfig.ready()``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from apps.core import registry
from apps.core.registry import Invariant, OverviewCard
from modelforge import metrics


def overview() -> dict[str, Any]:
    from apps.nodes.models import Node, liveness_now

    return {
        "liveness": dict(
            Node.objects.annotate(state=liveness_now())
            .values_list("state")
            .annotate(n=Count("pk"))
            .values_list("state", "n")
        ),
        "assignable": Node.objects.assignable().count(),
    }


class NodesCollector(Collector):
    def collect(self) -> Iterator[Any]:
        from apps.nodes.models import Node, liveness_now

        nodes = GaugeMetricFamily("modelforge_nodes", "Enrolled nodes by liveness.", labels=["liveness"])
        for liveness, count in (
            Node.objects.annotate(state=liveness_now()).values_list("state").annotate(n=Count("pk"))
        ):
            nodes.add_metric([liveness], count)
        yield nodes


def register() -> None:
    registry.invariants.register(
        Invariant(
            "gpu_memory_bounds",
            "every GPU's managed <= used <= total memory",
            "SELECT count(*) FROM nodes_gpu WHERE NOT (0 <= memory_managed_bytes "
            "AND memory_managed_bytes <= memory_used_bytes AND memory_used_bytes <= memory_total_bytes)",
        )
    )
    registry.overview_cards.register(OverviewCard("fleet", 10, "nodes/overview_card.html", overview))
    metrics.register(NodesCollector())
