"""What the gateway contributes to the platform's registries: the load balancer's gauges on ``/metrics``.
Registered by ``GatewayConfig.ready()``; ``lbstate`` is imported at scrape time only (it names its process
when imported, and gunicorn's master runs ``ready()`` before it forks the workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from modelforge import metrics


class LoadBalancerCollector(Collector):
    """The load balancer's shared Redis state at scrape time, the same in every web process."""

    def collect(self) -> Iterator[Any]:
        from apps.gateway.lbstate import read_bench_and_traffic

        benched, traffic, errors, redis_ok = read_bench_and_traffic(5)
        yield GaugeMetricFamily(
            "modelforge_lb_redis_reachable",
            "1 when the load balancer's shared state in Redis is reachable; 0: each process routes alone.",
            value=1 if redis_ok else 0,
        )
        yield GaugeMetricFamily(
            "modelforge_lb_benched_backends", "Backends on the sin-bin now.", value=len(benched)
        )
        requests = GaugeMetricFamily(
            "modelforge_lb_requests_5m", "Requests per backend, last 5 minutes.", labels=["backend"]
        )
        failures = GaugeMetricFamily(
            "modelforge_lb_failures_5m", "Failed requests per backend, last 5 minutes.", labels=["backend"]
        )
        for backend, count in traffic.items():
            requests.add_metric([backend], count)
        for backend, count in errors.items():
            failures.add_metric([backend], count)
        yield requests
        yield failures


def register() -> None:
    metrics.register(LoadBalancerCollector())
