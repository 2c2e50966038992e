"""The load-balancer card: configured share against actual share per backend, with a drift badge and
the reason the platform knows (benched/erroring, parked at weight 0)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from apps.clusters.lbstate import read_bench_and_traffic
from apps.clusters.models import Cluster, RoutingTier

WINDOW_MINUTES = 5
DRIFT_THRESHOLD = 0.10  # absolute difference of shares: "off by more than ~10%"
STEADY_MIN_REQUESTS = 100  # below this the window is not steady load: no badge


@dataclass
class MemberShare:
    member: str
    server: str | None
    weight: int
    configured_share: float
    actual_share: float | None
    requests: int
    errors: int
    drift: bool
    reason: str
    bench: dict[str, Any] | None


def cluster_report(cluster: Cluster) -> dict[str, Any]:
    benched, traffic, errors, redis_ok = read_bench_and_traffic(WINDOW_MINUTES)
    members = list(cluster.members.select_related("server"))
    attached = [m for m in members if m.server_id is not None]
    total_weight = sum(m.weight for m in attached) or 1
    keys = {m.pk: str(m.server_id) for m in attached}
    total = sum(traffic.get(k, 0) for k in keys.values())
    steady = total >= STEADY_MIN_REQUESTS
    now = time.time()
    # Members whose traffic others pick up: benched, erroring, or parked.
    troubled = {
        m.name
        for m in attached
        if m.weight == 0 or benched.get(keys[m.pk]) is not None or errors.get(keys[m.pk], 0)
    }
    rows = []
    for member in members:
        key = keys.get(member.pk)
        configured = member.weight / total_weight if key else 0.0
        served = traffic.get(key, 0) if key else 0
        failed = errors.get(key, 0) if key else 0
        actual = served / total if total and key else None
        drift = bool(steady and actual is not None and abs(actual - configured) > DRIFT_THRESHOLD)
        bench = benched.get(key) if key else None
        if key is None:
            reason = "no server attached"
        elif member.weight == 0:
            reason = "parked at weight 0"
        elif bench is not None:
            since, until = (time.strftime("%H:%M:%S", time.gmtime(t)) for t in (bench.since, bench.until))
            reason = (
                f"benched since {since} until {until} UTC (bench {bench.count} in the window): {bench.reason}"
            )
        elif failed:
            reason = f"erroring: {failed} failed request(s) in the window"
        elif drift and actual is not None and actual > configured and troubled:
            reason = f"carrying the share of {', '.join(sorted(troubled))} (benched, erroring or parked)"
        elif drift:
            reason = "no known reason: at capacity, or requests of very different cost"
        else:
            reason = ""
        rows.append(
            MemberShare(
                member=member.name,
                server=key,
                weight=member.weight,
                configured_share=round(configured, 4),
                actual_share=None if actual is None else round(actual, 4),
                requests=served,
                errors=failed,
                drift=drift,
                reason=reason,
                bench={**bench.as_dict(), "remaining_s": round(bench.until - now, 1)} if bench else None,
            )
        )
    shared_tier = (
        RoutingTier.objects.filter(
            tier__in=RoutingTier.objects.filter(cluster=cluster).values("tier"),
            capability__in=RoutingTier.objects.filter(cluster=cluster).values("capability"),
        )
        .exclude(cluster=cluster)
        .exists()
    )
    return {
        "cluster": cluster.name,
        "algorithm": cluster.algorithm,
        "effective_algorithm": "weighted_round_robin" if shared_tier else cluster.algorithm,
        "mixed_routing": shared_tier,
        "window_minutes": WINDOW_MINUTES,
        "requests": total,
        "steady": steady,
        "redis_ok": redis_ok,
        "members": [asdict(row) for row in rows],
    }
