"""The routing table and its balancers: mixed candidates fall back to weighted round-robin, smooth WRR
holds shares, a parked member gets no traffic."""

from __future__ import annotations

import pytest

from apps.clusters.models import Algorithm
from apps.clusters.tests.factories import bind, cluster_with, loopback_node, running_server
from apps.gateway.routing import Router, build_table, detached_clusters

pytestmark = pytest.mark.django_db


def test_candidates_spanning_clusters_or_a_standalone_server_use_weighted_round_robin():
    node = loopback_node()
    a, b, c = (running_server(node, n, 9000 + i) for i, n in enumerate("abc"))
    least = cluster_with("least", [(a, 1), (b, 1)], algorithm=Algorithm.LEAST_CONNECTIONS)
    bind("chat.general@1", cluster=least)
    router = Router()
    table = build_table()
    backends, algorithm, cluster = router.candidates_in(table, "chat.general@1", "")
    assert (algorithm, cluster, len(backends)) == ("least_connections", "least", 2)
    bind("chat.general@1", server=c, weight=2)
    backends, algorithm, cluster = router.candidates_in(build_table(), "chat.general@1", "")
    assert (algorithm, cluster, len(backends)) == ("weighted_round_robin", None, 3)


def test_smooth_weighted_round_robin_holds_shares_over_short_windows():
    node = loopback_node()
    a, b, c = (running_server(node, n, 9000 + i) for i, n in enumerate("abc"))
    bind("x.y@1", cluster=cluster_with("trio", [(a, 5), (b, 1), (c, 1)]))
    router = Router()
    backends, algorithm, _ = router.candidates_in(build_table(), "x.y@1", "")
    picks = [router.pick(backends, algorithm).name for _ in range(7)]  # type: ignore[union-attr]
    # nginx's sequence for 5:1:1 — a never runs more than three in a row.
    assert picks == ["trio/a", "trio/a", "trio/b", "trio/a", "trio/c", "trio/a", "trio/a"]


def test_a_parked_member_gets_no_traffic():
    node = loopback_node()
    a, b = running_server(node, "a", 9001), running_server(node, "b", 9002)
    bind("x.y@1", cluster=cluster_with("parked", [(a, 1), (b, 0)]))
    backends, _, _ = Router().candidates_in(build_table(), "x.y@1", "")
    assert [backend.name for backend in backends] == ["parked/a"]


def test_the_clusters_with_no_server_attached_are_named_and_whether_they_are_all_it_is_bound_to():
    node = loopback_node()
    a, b = (running_server(node, n, 9000 + i) for i, n in enumerate("ab"))
    pair = cluster_with("pair", [(a, 1)])
    bind("x.y@1", cluster=pair)
    assert detached_clusters(build_table(), "x.y@1", "") == ([], False)
    pair.members.update(server=None)
    assert detached_clusters(build_table(), "x.y@1", "") == (["'pair' (tier 0)"], True)
    # Another tier binds a server that is not running: the refusal stays NO_ELIGIBLE_NODE, naming pair.
    b.state = "stopped"
    b.save(update_fields=["state"])
    bind("x.y@1", server=b, tier=1)
    assert detached_clusters(build_table(), "x.y@1", "") == (["'pair' (tier 0)"], False)
    # Another project's detached cluster is not this credential's concern.
    bind("x.y@1", cluster=cluster_with("theirs", []), project="team-b")
    assert detached_clusters(build_table(), "x.y@1", "") == (["'pair' (tier 0)"], False)
