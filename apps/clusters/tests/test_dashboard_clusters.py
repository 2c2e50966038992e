"""Clusters, members, capabilities and routing tiers from the dashboard: the API's validation and codes,
membership locked while servers are attached, the algorithm a runtime knob."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.clusters.models import Capability, Cluster, ClusterMember, RoutingTier
from apps.clusters.tests.factories import loopback_node, running_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


def test_a_cluster_is_built_and_its_membership_locked_while_a_server_is_attached(operator):
    page = operator.post("/clusters/create", {"name": "embed", "algorithm": "least_connections"}, follow=True)
    cluster = Cluster.objects.get(name="embed")
    assert cluster.algorithm == "least_connections" and "Cluster embed created" in page.content.decode()
    for name, weight in (("a", "3"), ("b", "1")):
        operator.post(f"/clusters/{cluster.pk}/members/add", {"name": name, "gpus": "1", "weight": weight})
    a, b = ClusterMember.objects.get(name="a"), ClusterMember.objects.get(name="b")
    assert (a.weight, b.weight) == (3, 1)

    server = running_server(loopback_node(), "embed-1", 9999)
    operator.post(f"/clusters/members/{a.pk}/attach", {"server": server.pk})
    a.refresh_from_db()
    assert a.server_id == server.pk
    detail = operator.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "CLUSTER_MEMBERSHIP_LOCKED" in detail  # said before anyone tries

    edited = operator.post(f"/clusters/members/{b.pk}/edit", {"weight": "5"}, follow=True).content.decode()
    assert "CLUSTER_MEMBERSHIP_LOCKED" in edited and "Detach the servers first" in edited
    removed = operator.post(f"/clusters/members/{b.pk}/remove", follow=True).content.decode()
    added = operator.post(f"/clusters/{cluster.pk}/members/add", {"name": "c"}, follow=True).content.decode()
    assert "CLUSTER_MEMBERSHIP_LOCKED" in removed and "CLUSTER_MEMBERSHIP_LOCKED" in added
    b.refresh_from_db()
    assert b.weight == 1 and ClusterMember.objects.filter(cluster=cluster).count() == 2

    # The algorithm is a runtime router knob: accepted while attached.
    operator.post(f"/clusters/{cluster.pk}/algorithm", {"algorithm": "weighted_round_robin"})
    cluster.refresh_from_db()
    assert cluster.algorithm == "weighted_round_robin"

    # Detached, membership changes are accepted again.
    operator.post(f"/clusters/members/{a.pk}/detach")
    operator.post(f"/clusters/members/{b.pk}/edit", {"weight": "5"})
    b.refresh_from_db()
    assert b.weight == 5


def test_a_server_attached_elsewhere_or_a_bad_form_is_refused_by_name(operator):
    cluster = Cluster.objects.create(name="c1")
    first = ClusterMember.objects.create(cluster=cluster, name="a")
    second = ClusterMember.objects.create(cluster=cluster, name="b")
    server = running_server(loopback_node(), "s1", 9998)
    operator.post(f"/clusters/members/{first.pk}/attach", {"server": server.pk})
    page = operator.post(f"/clusters/members/{second.pk}/attach", {"server": server.pk}, follow=True)
    assert "already attached" in page.content.decode()
    second.refresh_from_db()
    assert second.server_id is None
    for junk in ("", "not-a-uuid", "7"):
        page = operator.post(f"/clusters/members/{second.pk}/attach", {"server": junk}, follow=True)
        assert page.status_code == 200 and "choose an existing model server" in page.content.decode()
    bad = operator.post("/clusters/create", {"name": "", "algorithm": "random"}, follow=True).content.decode()
    assert "VALIDATION_ERROR" in bad and "algorithm" in bad and Cluster.objects.count() == 1


@pytest.mark.parametrize(
    "name", [" rag.embedding@1", "RAG.embedding@1", "rag.embedding", "rag.embedding@one"]
)
def test_a_capability_is_written_exactly_or_refused(operator, name):
    page = operator.post("/clusters/capabilities/create", {"name": name}, follow=True).content.decode()
    assert "VALIDATION_ERROR" in page and not Capability.objects.exists()


def test_capabilities_and_routing_tiers_are_bound_and_removed(operator):
    operator.post("/clusters/capabilities/create", {"name": "rag.embedding@1", "description": "embeddings"})
    capability = Capability.objects.get(name="rag.embedding@1")
    cluster = Cluster.objects.create(name="embed")
    server = running_server(loopback_node(), "solo", 9997)

    both = operator.post(
        "/clusters/tiers/create",
        {"capability": capability.pk, "tier": "0", "cluster": cluster.pk, "server": server.pk},
        follow=True,
    ).content.decode()
    assert "VALIDATION_ERROR" in both and "exactly one of a cluster or a standalone server" in both
    assert not RoutingTier.objects.exists()

    operator.post("/clusters/tiers/create", {"capability": capability.pk, "tier": "0", "cluster": cluster.pk})
    operator.post(
        "/clusters/tiers/create",
        {"capability": capability.pk, "tier": "1", "server": server.pk, "weight": "2", "project": "search"},
    )
    fields = ("tier", "cluster", "server", "weight", "project")
    tiers = list(RoutingTier.objects.order_by("tier").values_list(*fields))
    assert tiers == [(0, cluster.pk, None, 1, ""), (1, None, server.pk, 2, "search")]
    page = operator.get("/clusters/").content.decode()
    assert "tier 0: cluster embed" in page and "tier 1: server solo (w2) [project search]" in page

    operator.post(f"/clusters/tiers/{RoutingTier.objects.get(tier=1).pk}/remove")
    assert list(RoutingTier.objects.values_list("tier", flat=True)) == [0]


def test_every_action_needs_a_staff_login(client):
    cluster = Cluster.objects.create(name="c")
    for url in ("/clusters/create", f"/clusters/{cluster.pk}/algorithm", "/clusters/capabilities/create"):
        response = client.post(url, {"name": "x", "algorithm": "least_connections"})
        assert response.status_code == 302 and "/login" in response["Location"]
    cluster.refresh_from_db()
    assert cluster.algorithm == "weighted_round_robin" and Cluster.objects.count() == 1


def test_a_cluster_is_built_from_selected_servers_in_one_step(operator, operator_client):
    node = loopback_node()
    one, two = running_server(node, "pick-1", 9101), running_server(node, "pick-2", 9102)
    failed = running_server(node, "pick-broken", 9103)
    failed.state = "failed"
    failed.save(update_fields=["state"])
    page = operator.get("/clusters/").content.decode()
    assert "pick-1" in page and "pick-broken" not in page.split('name="servers"')[1].split("</select>")[0]
    assert "CLUSTER_MEMBERSHIP_LOCKED" in page  # the order is said up front

    operator.post("/clusters/create", {"name": "picked", "servers": [str(one.pk), str(two.pk)]})
    cluster = Cluster.objects.get(name="picked")
    assert {(m.name, m.server_id, m.weight) for m in cluster.members.all()} == {
        ("pick-1", one.pk, 1),
        ("pick-2", two.pk, 1),
    }
    # The API does the same; a failed or already-serving server refuses the whole cluster, nothing written.
    for servers, why in (([str(failed.pk)], "pick-broken is failed"), ([str(one.pk)], "already serves")):
        answer = operator_client.post(
            "/api/v1/clusters", {"name": "again", "servers": servers}, format="json"
        )
        assert answer.status_code == 400 and why in answer.json()["message"], answer.content
    assert not Cluster.objects.filter(name="again").exists()
    assert ClusterMember.objects.count() == 2
