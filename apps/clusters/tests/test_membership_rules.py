"""The membership rules written once (apps.clusters.services) and refused alike by the API, the dashboard
and the admin: membership locked while a server is attached, a server serving one member at most."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.clusters import services
from apps.clusters.admin import ClusterMemberInline
from apps.clusters.models import Cluster, ClusterMember
from apps.clusters.tests.factories import cluster_with, loopback_node, running_server
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


@pytest.fixture
def admin_user_client(client):
    client.force_login(User.objects.create_superuser("root-ops", email="", password="x-long-password-1"))
    return client


def locked_pair() -> tuple[Cluster, ClusterMember]:
    """A cluster with one attached member (so locked) and one spare member."""
    node = loopback_node()
    cluster = cluster_with("pair", [(running_server(node, "a", 9001), 1)])
    return cluster, cluster.members.create(name="spare")


def refusal(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


# --- The rules ------------------------------------------------------------------------------------


def test_every_membership_change_is_refused_by_name_while_a_server_is_attached():
    cluster, spare = locked_pair()
    for call in (
        lambda: services.add_member(cluster, name="c"),
        lambda: services.edit_member(spare, weight=5),
        lambda: services.remove_member(spare),
    ):
        refused = refusal(call)
        assert (refused.code, refused.status) == ("CLUSTER_MEMBERSHIP_LOCKED", 409)
        assert "Detach the servers first" in refused.message
    spare.refresh_from_db()
    assert spare.weight == 1 and cluster.members.count() == 2


def test_moving_a_member_into_a_locked_cluster_is_a_membership_change_of_that_cluster():
    locked, _ = locked_pair()
    free = Cluster.objects.create(name="free")
    wanderer = free.members.create(name="wanderer")
    refused = refusal(lambda: services.edit_member(wanderer, cluster=locked))
    assert refused.code == "CLUSTER_MEMBERSHIP_LOCKED" and "pair" in refused.message
    wanderer.refresh_from_db()
    assert wanderer.cluster_id == free.pk


def test_detach_is_always_allowed_and_unlocks_membership():
    cluster, spare = locked_pair()
    for member in cluster.members.all():
        services.detach(member)
    assert not services.membership_locked(cluster)
    services.edit_member(spare, weight=5, name="spare-2")
    spare.refresh_from_db()
    assert (spare.name, spare.weight) == ("spare-2", 5)
    services.remove_member(spare)
    assert not ClusterMember.objects.filter(pk=spare.pk).exists()


def test_a_server_serves_one_member_at_most():
    cluster, spare = locked_pair()
    attached = cluster.members.get(name="a")
    server = attached.server
    assert server is not None
    refused = refusal(lambda: services.attach(spare, server))
    assert (refused.code, refused.status) == ("VALIDATION_ERROR", 400)
    assert "already attached" in refused.message
    services.attach(attached, server)  # attaching it again where it is: no change, no refusal
    spare.refresh_from_db()
    assert spare.server_id is None


def test_a_cluster_built_from_servers_has_a_member_attached_per_server():
    node = loopback_node()
    one, two = running_server(node, "one", 9101), running_server(node, "two", 9102)
    cluster = services.create_cluster(name="built", servers=[one, two])
    assert cluster.algorithm == "weighted_round_robin"
    assert {(m.name, m.server_id, m.weight) for m in cluster.members.all()} == {
        ("one", one.pk, 1),
        ("two", two.pk, 1),
    }
    assert services.membership_locked(cluster)


# --- The API --------------------------------------------------------------------------------------


def test_the_api_refuses_a_move_into_a_locked_cluster_and_detaches_while_locked(operator_client):
    locked, spare = locked_pair()
    free = Cluster.objects.create(name="free")
    wanderer = free.members.create(name="wanderer")
    moved = operator_client.patch(
        f"/api/v1/cluster-members/{wanderer.pk}", {"cluster": locked.pk}, format="json"
    )
    assert moved.status_code == 409 and moved.json()["code"] == "CLUSTER_MEMBERSHIP_LOCKED"

    attached = locked.members.get(name="a")
    detached = operator_client.post(f"/api/v1/cluster-members/{attached.pk}/detach")
    assert detached.status_code == 200 and detached.json()["server"] is None
    added = operator_client.post(
        "/api/v1/cluster-members", {"cluster": locked.pk, "name": "c", "gpus": 2}, format="json"
    )
    assert added.status_code == 201 and added.json()["gpus"] == 2 and added.json()["weight"] == 1
    assert operator_client.delete(f"/api/v1/cluster-members/{spare.pk}").status_code == 204


# --- The dashboard --------------------------------------------------------------------------------


def test_the_dashboard_refuses_removal_while_locked_and_removes_once_detached(staff):
    cluster, spare = locked_pair()
    page = staff.post(f"/clusters/members/{spare.pk}/remove", follow=True).content.decode()
    assert "CLUSTER_MEMBERSHIP_LOCKED" in page and ClusterMember.objects.filter(pk=spare.pk).exists()
    staff.post(f"/clusters/members/{cluster.members.get(name='a').pk}/detach")
    page = staff.post(f"/clusters/members/{spare.pk}/remove", follow=True).content.decode()
    assert "Member spare removed." in page and not ClusterMember.objects.filter(pk=spare.pk).exists()


# --- The admin ------------------------------------------------------------------------------------


def inline_form(cluster: Cluster, members: list[ClusterMember], **extra: str) -> dict[str, Any]:
    """The cluster's admin change form with its members inline, as the browser posts it."""
    data: dict[str, Any] = {
        "name": cluster.name,
        "algorithm": cluster.algorithm,
        "members-TOTAL_FORMS": str(len(members) + (1 if "new_name" in extra else 0)),
        "members-INITIAL_FORMS": str(len(members)),
        "members-MIN_NUM_FORMS": "0",
        "members-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for i, member in enumerate(members):
        data.update(
            {
                f"members-{i}-id": str(member.pk),
                f"members-{i}-cluster": str(cluster.pk),
                f"members-{i}-name": member.name,
                f"members-{i}-gpus": str(member.gpus),
                f"members-{i}-weight": extra.get(f"weight_{member.name}", str(member.weight)),
                f"members-{i}-server": str(member.server_id or ""),
            }
        )
    if "new_name" in extra:
        i = len(members)
        data.update(
            {
                f"members-{i}-cluster": str(cluster.pk),
                f"members-{i}-name": extra["new_name"],
                f"members-{i}-gpus": "1",
                f"members-{i}-weight": "1",
                f"members-{i}-server": extra.get("new_server", ""),
            }
        )
    return data


def test_the_admin_writes_members_through_the_rules_and_attaches_last(admin_user_client):
    cluster = Cluster.objects.create(name="adm")
    first = cluster.members.create(name="first")
    server = running_server(loopback_node(), "adm-1", 9201)
    url = f"/admin/clusters/cluster/{cluster.pk}/change/"
    form = inline_form(cluster, [first], weight_first="4", new_name="second", new_server=str(server.pk))
    response = admin_user_client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    first.refresh_from_db()
    second = cluster.members.get(name="second")
    assert first.weight == 4 and second.server_id == server.pk
    assert services.membership_locked(cluster)


def test_the_admin_hides_membership_edits_and_cluster_deletion_while_locked(admin_user_client):
    cluster, _ = locked_pair()
    page = admin_user_client.get(f"/admin/clusters/cluster/{cluster.pk}/change/").content.decode()
    assert 'name="members-0-weight"' not in page  # read-only inline
    assert admin_user_client.get(f"/admin/clusters/cluster/{cluster.pk}/delete/").status_code == 403


def test_an_admin_save_that_lost_the_race_to_an_attach_is_refused_and_writes_nothing(
    admin_user_client, monkeypatch
):
    # Regression: the admin's inline used to save members without the lock the API and dashboard take.
    cluster, spare = locked_pair()
    monkeypatch.setattr(ClusterMemberInline, "_unlocked", lambda self, obj: True)  # the page was stale
    members = list(cluster.members.order_by("name"))
    form = inline_form(cluster, members, weight_spare="9")
    page = admin_user_client.post(
        f"/admin/clusters/cluster/{cluster.pk}/change/", form, follow=True
    ).content.decode()
    assert "CLUSTER_MEMBERSHIP_LOCKED" in page
    spare.refresh_from_db()
    assert spare.weight == 1


# --- Deleting a cluster ---------------------------------------------------------------------------
# Deleting a cluster removes its members and routing tiers: with a server attached that is routing pulled
# from under live traffic. The admin refused it (its delete page) while the API deleted it; one rule now.


def test_the_api_refuses_to_delete_a_cluster_with_servers_attached(operator_client):
    cluster, _ = locked_pair()
    response = operator_client.delete(f"/api/v1/clusters/{cluster.pk}")
    assert response.status_code == 409
    assert response.json()["code"] == "CLUSTER_MEMBERSHIP_LOCKED"
    assert Cluster.objects.filter(pk=cluster.pk).exists()
    assert cluster.members.count() == 2


def test_the_api_deletes_a_cluster_once_its_servers_are_detached(operator_client):
    cluster, _ = locked_pair()
    for member in cluster.members.exclude(server=None):
        services.detach(member)
    assert operator_client.delete(f"/api/v1/clusters/{cluster.pk}").status_code == 204
    assert not Cluster.objects.filter(pk=cluster.pk).exists()


def test_the_admins_bulk_delete_refuses_a_locked_cluster_and_deletes_nothing(admin_user_client):
    cluster, _ = locked_pair()
    free = Cluster.objects.create(name="free")
    response = admin_user_client.post(
        "/admin/clusters/cluster/",
        {"action": "delete_selected", "_selected_action": [cluster.pk, free.pk], "post": "yes"},
    )
    assert response.status_code == 403  # the locked cluster's members may not be deleted (the inline's rule)
    assert Cluster.objects.filter(pk__in=[cluster.pk, free.pk]).count() == 2
