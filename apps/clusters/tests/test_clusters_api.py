"""Clusters through the operator API: membership locked while servers are attached, the algorithm a
runtime knob; capabilities and credentials written exactly."""

from __future__ import annotations

import pytest

from apps.clusters.models import ClientCredential
from apps.clusters.tests.factories import cluster_with, loopback_node, running_server

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
