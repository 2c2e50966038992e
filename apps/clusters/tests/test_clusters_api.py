"""Clusters through the operator API: membership locked while servers are attached, the algorithm a
runtime knob; capabilities and credentials written exactly; mixed candidates fall back to WRR."""

from __future__ import annotations

import pytest

from apps.clusters.models import Algorithm, ClientCredential
from apps.clusters.routing import Router, build_table
from apps.clusters.tests.factories import bind, cluster_with, loopback_node, running_server

pytestmark = pytest.mark.django_db


def test_membership_is_locked_while_servers_are_attached_but_the_algorithm_is_not(operator_client):
    node = loopback_node()
    a, b = running_server(node, "a", 9001), running_server(node, "b", 9002)
    cluster = cluster_with("pair", [(a, 1), (b, 1)])
    member = cluster.members.first()
    assert member is not None
    for attempt in (
        operator_client.patch(f"/api/v1/cluster-members/{member.pk}", {"weight": 5}, format="json"),
        operator_client.patch(f"/api/v1/cluster-members/{member.pk}", {"name": "renamed"}, format="json"),
        operator_client.post(
            "/api/v1/cluster-members", {"cluster": cluster.pk, "name": "c", "gpus": 1}, format="json"
        ),
        operator_client.delete(f"/api/v1/cluster-members/{member.pk}"),
    ):
        assert attempt.status_code == 409
        assert attempt.json()["code"] == "CLUSTER_MEMBERSHIP_LOCKED"
        assert "Detach the servers first" in attempt.json()["message"]
    changed = operator_client.patch(
        f"/api/v1/clusters/{cluster.pk}", {"algorithm": "least_connections"}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["algorithm"] == "least_connections"

    for m in cluster.members.all():
        assert operator_client.post(f"/api/v1/cluster-members/{m.pk}/detach").status_code == 200
    assert (
        operator_client.patch(
            f"/api/v1/cluster-members/{member.pk}", {"weight": 5}, format="json"
        ).status_code
        == 200
    )


@pytest.mark.parametrize(
    "name", ["rag.embedding", "RAG.embedding@1", "rag.embedding@1 ", " rag.embedding@1", "a@0"]
)
def test_capabilities_and_scopes_are_written_exactly(operator_client, name):
    assert operator_client.post("/api/v1/capabilities", {"name": name}, format="json").status_code == 400
    minted = operator_client.post(
        "/api/v1/client-credentials", {"name": "app", "scopes": [name]}, format="json"
    )
    assert minted.status_code == 400 and minted.json()["code"] == "VALIDATION_ERROR"


def test_a_credential_is_shown_once_and_stored_hashed(operator_client):
    minted = operator_client.post(
        "/api/v1/client-credentials",
        {"name": "search", "scopes": ["rag.embedding@1"], "project": "p1"},
        format="json",
    )
    assert minted.status_code == 201
    plain = minted.json()["credential"]
    assert plain.startswith("mfc_")
    stored = ClientCredential.objects.get()
    assert plain not in str(stored.__dict__)
    assert "credential" not in operator_client.get(f"/api/v1/client-credentials/{stored.pk}").json()
    assert operator_client.post(f"/api/v1/client-credentials/{stored.pk}/revoke").json()["revoked_at"]


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


def test_a_server_already_attached_to_another_member_is_a_validation_error_not_a_500(operator_client):
    node = loopback_node()
    a = running_server(node, "a", 9001)
    cluster = cluster_with("pair", [(a, 1)])
    spare = cluster.members.create(name="spare")
    refused = operator_client.post(
        f"/api/v1/cluster-members/{spare.pk}/attach", {"server": a.pk}, format="json"
    )
    assert refused.status_code == 400 and refused.json()["code"] == "VALIDATION_ERROR"
    assert "already attached" in str(refused.json())
    for junk in ("not-a-uuid", 7):
        refused = operator_client.post(
            f"/api/v1/cluster-members/{spare.pk}/attach", {"server": junk}, format="json"
        )
        assert refused.status_code == 400 and refused.json()["code"] == "VALIDATION_ERROR"
    spare.refresh_from_db()
    assert spare.server_id is None
