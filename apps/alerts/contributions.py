"""What alerts contribute to the platform's registries: an invariant over its table, the overview's card
and the open-alert gauge on ``/metrics``. Registered by ``AlertsConfig.ready()``."""

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
    from apps.alerts.models import Alert

    return {
        "open_alerts": Alert.objects.open().values("severity").annotate(n=Count("pk")).order_by("severity")
    }


class AlertsCollector(Collector):
    def collect(self) -> Iterator[Any]:
        from apps.alerts.models import Alert

        alerts = GaugeMetricFamily(
            "modelforge_alerts_open", "Open alerts by code and severity.", labels=["code", "severity"]
        )
        for code, severity, count in (
            Alert.objects.open().values_list("code", "severity").annotate(n=Count("pk"))
        ):
            alerts.add_metric([code, severity], count)
        yield alerts


def register() -> None:
    registry.invariants.register(
        Invariant(
            "one_open_alert_per_key",
            "at most one open alert per de-duplication key",
            "SELECT count(*) FROM (SELECT dedup_key FROM alerts_alert WHERE cleared_at IS NULL "
            "GROUP BY dedup_key HAVING count(*) > 1) AS d",
        )
    )
    registry.overview_cards.register(OverviewCard("alerts", 30, "alerts/overview_card.html", overview))
    metrics.register(AlertsCollector())
