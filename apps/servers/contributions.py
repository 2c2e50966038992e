"""What servers contribute to the platform's registries: reservations stay on their node (an invariant),
the overview's Model servers card and the state gauge on ``/metrics``. Registered by
``ServersConfig.ready()``."""

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
    from apps.servers.models import ModelServer

    return {
        "servers": dict(
            ModelServer.objects.values_list("state").annotate(n=Count("pk")).values_list("state", "n")
        )
    }


class ServersCollector(Collector):
    def collect(self) -> Iterator[Any]:
        from apps.servers.models import ModelServer

        servers = GaugeMetricFamily("modelforge_model_servers", "Model servers by state.", labels=["state"])
        for state, count in ModelServer.objects.values_list("state").annotate(n=Count("pk")):
            servers.add_metric([state], count)
        yield servers


def register() -> None:
    registry.invariants.register(
        Invariant(
            "reservations_on_their_node",
            "every GPU reservation is on a GPU of the node it names",
            "SELECT count(*) FROM servers_reservation r JOIN nodes_gpu g ON g.id = r.gpu_id "
            "WHERE g.node_id <> r.node_id",
        )
    )
    registry.overview_cards.register(OverviewCard("servers", 20, "servers/overview_card.html", overview))
    metrics.register(ServersCollector())
