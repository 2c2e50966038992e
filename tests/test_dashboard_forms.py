"""Dashboard forms offer what exists (reported models, ready artifacts, online nodes, free running
servers), register artifacts through the API's serializer, and the admin says "Capabilities" and how long
stuck work has been waiting."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.artifacts.models import Artifact
from apps.backups.models import Backup
from apps.clusters.models import Cluster, ClusterMember
from apps.clusters.tests.factories import loopback_node, running_server
from apps.servers.models import ModelServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("ops", email="", password="x"))
    return client


def test_placing_a_server_offers_reported_models_ready_artifacts_and_online_nodes(operator):
    loopback_node("rig-a")  # online; reports bge-small
    Artifact.objects.create(
        name="qwen-0.5b", source_kind="http", locator="https://example.com/q", state="ready"
    )
    Artifact.objects.create(
        name="held", source_kind="http", locator="https://example.com/h", state="quarantined"
    )
    body = operator.get("/servers/new/").content.decode()
    assert '<datalist id="model-choices">' in body
    assert '<option value="bge-small">on rig-a</option>' in body
    assert '<option value="qwen-0.5b">ready artifact</option>' in body and "held" not in body
    assert '<select id="node" name="node">' in body and '<option value="rig-a"' in body


def test_the_cluster_page_offers_only_free_running_servers_says_the_order_and_defaults_gpus_to_0(operator):
    node = loopback_node()
    running_server(node, "up", 9001)
    ModelServer.objects.create(
        name="starting-one", profile="test-echo", model="m", node=node, state="starting"
    )
    ModelServer.objects.create(name="broken", profile="test-echo", model="m", node=node, state="failed")
    taken = running_server(node, "taken", 9002)
    other = Cluster.objects.create(name="other")
    ClusterMember.objects.create(cluster=other, name="x", server=taken)
    cluster = Cluster.objects.create(name="embed")
    ClusterMember.objects.create(cluster=cluster, name="a")
    body = operator.get(f"/clusters/{cluster.pk}/").content.decode()
    select = body.split('aria-label="Server for a"')[1].split("</select>")[0]
    assert ">up (running" in select and ">starting-one (starting" in select
    assert "broken" not in select and "taken" not in select  # regression: failed and attached servers offered
    assert 'id="build-order"' in body and "Add every member first" in body
    assert 'name="gpus" size="3" value="0"' in body


def test_an_artifact_is_registered_from_the_dashboard_and_refusals_show_their_code(operator):
    refused = operator.post("/artifacts/register", {"name": "", "source_kind": "http"}, follow=True)
    text = refused.content.decode()
    assert "VALIDATION_ERROR" in text and "name" in text and not Artifact.objects.exists()
    bad_digest = operator.post(
        "/artifacts/register",
        {"name": "m", "source_kind": "http", "locator": "https://example.com/m", "expected_sha256": "a.bin"},
        follow=True,
    ).content.decode()
    assert "VALIDATION_ERROR" in bad_digest and "path sha256" in bad_digest
    page = operator.post(
        "/artifacts/register",
        {"name": "tiny", "source_kind": "http", "locator": "https://example.com/tiny.bin", "licence": "mit"},
        follow=True,
    )
    artifact = Artifact.objects.get(name="tiny")
    assert artifact.source_kind == "http" and artifact.licence == "mit"
    assert page.redirect_chain[-1][0] == f"/artifacts/{artifact.pk}/"
    assert 'id="register-artifact"' in operator.get("/artifacts/").content.decode()


def test_a_quarantined_artifact_offers_no_replicate_and_sizes_read_well(operator):
    held = Artifact.objects.create(
        name="held", source_kind="http", locator="https://e.com/h", state="quarantined", size_bytes=67
    )
    ready = Artifact.objects.create(name="ok", source_kind="http", locator="https://e.com/o", state="ready")
    held_page = operator.get(f"/artifacts/{held.pk}/").content.decode()
    assert "Replicate to this node" not in held_page and "Only a ready artifact is replicated" in held_page
    assert "Replicate to this node" in operator.get(f"/artifacts/{ready.pk}/").content.decode()
    listing = operator.get("/artifacts/").content.decode()
    assert "67 B" in listing and "0.0 GiB" not in listing  # regression: a 67-byte artifact was "0.0 GiB"


def test_the_admin_says_capabilities_and_how_long_work_is_in_its_state(operator):
    index = operator.get("/admin/").content.decode()
    assert "Capabilities" in index and "Capabilitys" not in index
    node = loopback_node()
    server = ModelServer.objects.create(
        name="slow", profile="test-echo", model="m", node=node, state="starting"
    )
    server.events.create(from_state="placing", to_state="starting", detail="")
    Artifact.objects.create(name="a", source_kind="http", locator="https://e.com/a")
    Backup.objects.create()
    for url in ("/admin/servers/modelserver/", "/admin/artifacts/artifact/", "/admin/backups/backup/"):
        response = operator.get(url)
        assert response.status_code == 200 and "in this state since" in response.content.decode().lower(), url
    assert "just now" in operator.get("/admin/servers/modelserver/").content.decode()
