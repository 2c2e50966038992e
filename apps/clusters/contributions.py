"""What clusters contribute to the platform's registries: credentials stored hashed (an invariant over
client credentials, and the node credentials below it), and the load balancer's gauges on ``/metrics``.
Registered by ``ClustersConfig.ready()``.

The load-balancer gauges belong to the data path: they move with ``lbstate`` to ``apps.gateway``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from apps.core import registry
from apps.core.registry import Invariant
from modelforge import metrics


class LoadBalancerCollector(Collector):
    """The load balancer's shared Redis state at scrape time, the same in every web process."""

    def collect(self) -> Iterator[Any]:
        from apps.clusters.lbstate import read_bench_and_traffic

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
    registry.invariants.register(
        Invariant(
            "credentials_hashed",
            "every client credential and node credential is stored as a 64-hex digest",
            "SELECT (SELECT count(*) FROM clusters_clientcredential WHERE secret_hash !~ '^[0-9a-f]{64}$') "
            "+ (SELECT count(*) FROM nodes_node WHERE credential_hash !~ '^[0-9a-f]{64}$')",
        )
    )
    metrics.register(LoadBalancerCollector())
