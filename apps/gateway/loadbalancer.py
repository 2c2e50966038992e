"""The load-balancer card: configured share against actual share per backend, with a drift badge and
the reasons the platform knows. Seeds: drift "means a backend is erroring (and being briefly benched),
is at capacity, or is parked at weight 0" — each is detected (the bench list, errors, 429/503 answers
counted per backend, the weight) and shown whenever it applies, with or without drift."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings

from apps.clusters.models import Algorithm, Capability, Cluster, RoutingTier
from apps.gateway.lbstate import read_in_flight, read_queue_depths, read_window
from apps.gateway.probe import read_verdicts, summary
from apps.servers.profiles import runtime_profiles

WINDOW_MINUTES = 5
DRIFT_THRESHOLD = 0.10  # absolute difference of shares: "off by more than ~10%"
STEADY_MIN_REQUESTS = 100  # below this the window is not steady load: no badge
# The seed's three reasons (erroring is split from benched: a bench is the erroring that sat it out), and
# failing its health probe (apps/gateway/probe.py): no traffic until it answers.
REASONS = ("probe_failed", "benched", "erroring", "at_capacity", "parked")


@dataclass
class MemberShare:
    member: str
    server: str | None
    weight: int
    configured_share: float
    actual_share: float | None
    requests: int
    errors: int
    busy: int  # answers 429/503 in the window: the backend at capacity
    drift: bool
    reasons: list[str]  # of REASONS, in that order: what applies to this member now
    reason: str
    bench: dict[str, Any] | None
    # The gateway processes' probes of it: state up / down / unknown, since, checked_at, reason, processes
    # (how many have a fresh verdict), down_in (how many of them find it down).
    probe: dict[str, Any]
    # Under prefix affinity: requests routed by their prefix, and the share of them that went to the
    # backend holding their prefix (its home on the ring): the cache-hit share. None otherwise.
    affinity_requests: int | None = None
    cache_hit_share: float | None = None
    # Admission (apps/gateway/admission.py): its runtime profile's max_concurrent (None: no limit), and the
    # requests in flight to it across the gateway processes as of their last flush (None: Redis unread).
    max_concurrent: int | None = None
    in_flight: int | None = None


def cluster_report(cluster: Cluster) -> dict[str, Any]:
    # Only the current shape's traffic: the window starts when the membership last changed (a server
    # attached or detached, a member added, edited or removed), else old weights' requests skew the shares.
    window = read_window(WINDOW_MINUTES, cluster=cluster.pk)
    benched, traffic, errors, busy = window.benched, window.traffic, window.errors, window.busy
    verdicts = read_verdicts() or {}
    flying = read_in_flight() if window.redis_ok else None
    profiles = runtime_profiles()
    members = list(cluster.members.select_related("server"))
    attached = [m for m in members if m.server_id is not None]
    total_weight = sum(m.weight for m in attached) or 1
    keys = {m.pk: str(m.server_id) for m in attached}
    total = sum(traffic.get(k, 0) for k in keys.values())
    steady = total >= STEADY_MIN_REQUESTS
    now = time.time()
    shared_tier = (
        RoutingTier.objects.filter(
            tier__in=RoutingTier.objects.filter(cluster=cluster).values("tier"),
            capability__in=RoutingTier.objects.filter(cluster=cluster).values("capability"),
        )
        .exclude(cluster=cluster)
        .exists()
    )
    effective = Algorithm.WEIGHTED_ROUND_ROBIN if shared_tier else cluster.algorithm
    # Under prefix affinity shares follow the prefixes, not the weights, by design: no drift is judged;
    # the card shows how often a request reached the backend holding its prefix instead.
    affinity = effective == Algorithm.PREFIX_AFFINITY
    routed, hits = window.affinity_routed, window.affinity_hits
    # Members whose traffic others pick up: benched, erroring, at capacity, or parked.
    probes = {key: summary(verdicts.get(key)) for key in keys.values()}
    troubled = {
        m.name
        for m in attached
        if m.weight == 0
        or probes[keys[m.pk]]["state"] == "down"
        or benched.get(keys[m.pk]) is not None
        or errors.get(keys[m.pk], 0)
        or busy.get(keys[m.pk], 0)
    }
    rows = []
    for member in members:
        key = keys.get(member.pk)
        configured = member.weight / total_weight if key else 0.0
        served = traffic.get(key, 0) if key else 0
        failed = errors.get(key, 0) if key else 0
        full = busy.get(key, 0) if key else 0
        actual = served / total if total and key else None
        drift = bool(
            steady and not affinity and actual is not None and abs(actual - configured) > DRIFT_THRESHOLD
        )
        bench = benched.get(key) if key else None
        reasons: list[str] = []
        said: list[str] = []
        probe = probes.get(key) if key else None
        if probe is not None and probe["state"] == "down":
            reasons.append("probe_failed")
            since = time.strftime("%H:%M:%S", time.gmtime(probe["since"]))
            said.append(
                f"failing its health probe since {since} UTC ({probe['reason']}; down for "
                f"{probe['down_in']} of {probe['processes']} gateway process(es)): no traffic until it "
                "answers"
            )
        if key is not None and bench is not None:
            since, until = (time.strftime("%H:%M:%S", time.gmtime(t)) for t in (bench.since, bench.until))
            reasons.append("benched")
            said.append(
                f"benched since {since} until {until} UTC (bench {bench.count} in the window): {bench.reason}"
            )
        elif failed:
            reasons.append("erroring")
            said.append(f"erroring: {failed} failed request(s) in the window")
        if full:
            reasons.append("at_capacity")
            said.append(f"at capacity: {full} answer(s) 429/503 in the window")
        if key is not None and member.weight == 0:
            reasons.append("parked")
            said.append("parked at weight 0")
        if key is None:
            reason = "no server attached"
        elif said:
            reason = "; ".join(said)
        elif drift and actual is not None and actual > configured and troubled:
            others = ", ".join(sorted(troubled))
            reason = (
                f"carrying the share of {others} "
                "(failing its probe, benched, erroring, at capacity or parked)"
            )
        elif drift:
            reason = "no known reason: requests of very different cost, or a change of weights in the window"
        elif affinity and steady and actual is not None and abs(actual - configured) > DRIFT_THRESHOLD:
            reason = "its share follows the prefixes it holds (prefix affinity), not its weight: by design"
        else:
            reason = ""
        affinity_requests = routed.get(key, 0) if key and affinity else None
        profile = profiles.get(member.server.profile) if member.server is not None else None
        rows.append(
            MemberShare(
                member=member.name,
                server=key,
                weight=member.weight,
                configured_share=round(configured, 4),
                actual_share=None if actual is None else round(actual, 4),
                requests=served,
                errors=failed,
                busy=full,
                drift=drift,
                reasons=reasons,
                reason=reason,
                bench={**bench.as_dict(), "remaining_s": round(bench.until - now, 1)} if bench else None,
                probe=probe or summary(None),
                affinity_requests=affinity_requests,
                cache_hit_share=(
                    round(hits.get(key, 0) / affinity_requests, 4) if key and affinity_requests else None
                ),
                max_concurrent=profile.max_concurrent if profile is not None else None,
                in_flight=flying.get(key, 0) if key and flying is not None else None,
            )
        )
    all_routed = sum(routed.get(k, 0) for k in keys.values()) if affinity else 0
    return {
        "cluster": cluster.name,
        "algorithm": cluster.algorithm,
        "effective_algorithm": effective,
        "mixed_routing": shared_tier,
        "window_minutes": WINDOW_MINUTES,
        "requests": total,
        "steady": steady,
        "redis_ok": window.redis_ok,
        "probe_every_s": settings.GATEWAY_PROBE_EVERY_S,
        "members": [asdict(row) for row in rows],
        # Prefix affinity: the requests it routed in the window and the share that reached the backend
        # holding their prefix (None under the other algorithms, or with none routed yet).
        "cache_hit_share": (
            round(sum(hits.get(k, 0) for k in keys.values()) / all_routed, 4) if all_routed else None
        ),
        "affinity_requests": all_routed if affinity else None,
        "load_cap_pct": settings.GATEWAY_AFFINITY_LOAD_CAP_PCT if affinity else None,
        "queue": admission_queue(cluster, window.redis_ok),
        "queue_max_waiting": settings.GATEWAY_QUEUE_MAX_WAITING,
        "queue_deadline_s": settings.GATEWAY_QUEUE_DEADLINE_S,
    }


def admission_queue(cluster: Cluster, redis_ok: bool) -> list[dict[str, Any]]:
    """Each capability the cluster serves (its routing tiers', and the aliases that follow them) with the
    requests waiting for it at the gateway now, summed over the web processes as of their last flush:
    the same figure as the Clusters page's *Waiting* column and ``modelforge_gateway_queue_depth``.
    ``waiting`` is None when Redis cannot be read."""
    bound = set(RoutingTier.objects.filter(cluster=cluster).values_list("capability__name", flat=True))
    bound |= set(Capability.objects.filter(follows__name__in=bound).values_list("name", flat=True))
    depths = read_queue_depths() if redis_ok else None
    return [
        {"capability": name, "waiting": None if depths is None else depths.get(name, 0)}
        for name in sorted(bound)
    ]
