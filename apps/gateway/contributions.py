"""What the gateway contributes to the platform's registries: the load balancer's gauges on ``/metrics``.
Registered by ``GatewayConfig.ready()``; ``lbstate`` is imported at scrape time only (it names its process
when imported, and gunicorn's master runs ``ready()`` before it forks the workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from apps.clusters import codes
from modelforge import metrics

QUEUE_REFUSAL_CODES = (codes.QUEUE_FULL, codes.QUEUE_TIMEOUT)


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
        yield queue_depth()
        yield probe_gauge()


def queue_depth() -> GaugeMetricFamily:
    """Requests waiting in the admission queues (apps/gateway/admission.py) per capability, summed over
    the web processes as of their last flush; every capability has a value, 0 when none waits."""
    from apps.clusters.models import Capability
    from apps.gateway.lbstate import read_queue_depths

    family = GaugeMetricFamily(
        "modelforge_gateway_queue_depth",
        "Requests waiting at the gateway for a backend below its runtime profile's max_concurrent.",
        labels=["capability"],
    )
    depths = read_queue_depths()
    if depths is None:  # modelforge_lb_redis_reachable says why
        return family
    for name in sorted({*Capability.objects.values_list("name", flat=True), *depths}):
        family.add_metric([name], depths.get(name, 0))
    return family


def probe_gauge() -> GaugeMetricFamily:
    """Each probed backend: 1 when it answers its health probe (every gateway process with a fresh
    verdict finds it up), 0 when one finds it down (it gets no traffic). Absent: not probed recently."""
    from apps.gateway.probe import read_verdicts, summary

    gauge = GaugeMetricFamily(
        "modelforge_gateway_backend_probe_up",
        "1 when the backend answers the gateway's health probe; 0: no traffic until it does.",
        labels=["backend", "server"],
    )
    for key, verdicts in sorted((read_verdicts() or {}).items()):
        state = summary(verdicts)
        name = next((str(v["name"]) for v in verdicts if v.get("name")), key)
        gauge.add_metric([name, key], 1 if state["state"] == "up" else 0)
    return gauge


class ServingCollector(Collector):
    """Requests, errors, limit refusals, tokens, and histograms of time to first token and total time per
    capability and backend, and admission's queue refusals per capability and code, totalled in Redis by
    every gateway process's flush (apps/gateway/usage.py)."""

    def collect(self) -> Iterator[Any]:
        from apps.clusters.models import Capability
        from apps.gateway.usage import BUCKETS, QUEUE_REFUSALS, SEP, TOTALS, TOTALS_KEY

        try:
            raw = _redis().hgetall(TOTALS_KEY)
        except (redis.RedisError, OSError):
            return  # modelforge_lb_redis_reachable says why
        counters = {
            name: CounterMetricFamily(
                f"modelforge_gateway_{name}", help_text, labels=["capability", "backend"]
            )
            for name, help_text in (
                ("requests", "Authorised calls through the gateway."),
                ("errors", "Authorised calls answered 400 or more (limit refusals included)."),
                ("limited", "Calls refused by a credential's limits (429)."),
                ("prompt_tokens", "Prompt tokens, as the engines count them."),
                ("completion_tokens", "Completion tokens, as the engines count them."),
            )
        }
        histograms: dict[str, dict[tuple[str, str], dict[str, int]]] = {"ttft": {}, "latency": {}}
        # Every capability has both codes from the start, 0 until refused: an alert on increase() then
        # sees the first refusal (a series born at 1 shows no increase).
        refusals = dict.fromkeys(
            (
                (name, code)
                for name in Capability.objects.values_list("name", flat=True)
                for code in QUEUE_REFUSAL_CODES
            ),
            0,
        )
        for key, value in raw.items():
            field = key.decode() if isinstance(key, bytes) else key
            parts = field.split(SEP)
            if len(parts) != 3:
                continue
            capability, backend, metric = parts
            if metric == QUEUE_REFUSALS:  # the code in the backend's place: the request reached none
                refusals[(capability, backend)] = int(value)
                continue
            if metric in TOTALS:
                counters[metric].add_metric([capability, backend], int(value))
                continue
            kind = metric.split("_", 1)[0]
            if kind in histograms:
                histograms[kind].setdefault((capability, backend), {})[metric.split("_", 1)[1]] = int(value)
        yield from counters.values()
        refused = CounterMetricFamily(
            "modelforge_gateway_queue_refusals",
            "Requests refused by the gateway's admission queue: QUEUE_FULL (the queue held "
            "MODELFORGE_GATEWAY_QUEUE_MAX_WAITING) or QUEUE_TIMEOUT (waited "
            "MODELFORGE_GATEWAY_QUEUE_DEADLINE_S).",
            labels=["capability", "code"],
        )
        for (capability, code), count in sorted(refusals.items()):
            refused.add_metric([capability, code], count)
        yield refused
        for kind, help_text in (
            ("ttft", "Time to first token of streamed answers, seconds."),
            ("latency", "Total time of authorised calls, seconds."),
        ):
            family = HistogramMetricFamily(
                f"modelforge_gateway_{kind}_seconds", help_text, labels=["capability", "backend"]
            )
            for (capability, backend), found in histograms[kind].items():
                running, buckets = 0, []
                for bound in (*BUCKETS, "inf"):
                    running += found.get(f"le_{bound}", 0)
                    buckets.append(("+Inf" if bound == "inf" else str(bound), running))
                family.add_metric([capability, backend], buckets, found.get("sum_us", 0) / 1e6)
            yield family


def _redis() -> redis.Redis:
    from django.conf import settings

    return redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.5, socket_timeout=1)


def register() -> None:
    metrics.register(LoadBalancerCollector())
    metrics.register(ServingCollector())
