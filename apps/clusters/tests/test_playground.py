"""The Playground's credential (issue 18, item 6): minted for an operator's session, scoped to exactly the
capability picked, expiring within minutes, reused while it lasts, labelled apart from client credentials,
revoked at log-out; refusals in the envelope, never a 500."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from apps.clusters import playground
from apps.clusters.models import Capability, ClientCredential, RoutingTier, digest
from apps.clusters.tests.factories import running_server
from apps.nodes.tests.factories import make_node

pytestmark = pytest.mark.django_db
URL = "/clusters/playground/credential"


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    Capability.objects.create(name="chat.echo@1")
    Capability.objects.create(name="rag.embedding@1")
    return client


def test_it_mints_a_credential_scoped_to_exactly_the_capability_for_fifteen_minutes(operator):
    before = timezone.now()
    answer = operator.post(URL, {"capability": "chat.echo@1"})
    assert answer.status_code == 201, answer.content
    body = answer.json()
    credential = ClientCredential.objects.get(pk=body["id"])
    assert digest(body["credential"]) == credential.secret_hash and body["credential"].startswith("mfc_")
    assert credential.scopes == ["chat.echo@1"] and credential.project == ""
    assert credential.kind == "playground" and credential.created_by == User.objects.get(username="ops")
    assert credential.name == "playground: ops"
    assert credential.expires_at is not None
    assert before + timedelta(minutes=15) <= credential.expires_at <= timezone.now() + timedelta(minutes=15)
    assert body["reused"] is False and body["capability"] == "chat.echo@1"


def test_it_reuses_the_credential_while_it_lasts_and_mints_another_near_its_end(operator):
    first = operator.post(URL, {"capability": "chat.echo@1"}).json()
    again = operator.post(URL, {"capability": "chat.echo@1"})
    assert again.status_code == 200 and again.json()["id"] == first["id"] and again.json()["reused"]
    assert again.json()["credential"] == first["credential"]
    # Another capability: a credential of its own (a scope is exact, never widened).
    other = operator.post(URL, {"capability": "rag.embedding@1"}).json()
    assert other["id"] != first["id"]
    assert ClientCredential.objects.get(pk=other["id"]).scopes == ["rag.embedding@1"]
    # Under two minutes left: a new one rather than one that expires mid-conversation.
    with time_machine.travel(timezone.now() + timedelta(minutes=13, seconds=30)):
        later = operator.post(URL, {"capability": "chat.echo@1"})
    assert later.status_code == 201 and later.json()["id"] != first["id"]
    assert ClientCredential.objects.filter(kind="playground").count() == 3


def test_a_revoked_playground_credential_is_replaced_not_reused(operator):
    first = operator.post(URL, {"capability": "chat.echo@1"}).json()
    ClientCredential.objects.get(pk=first["id"]).revoke()
    second = operator.post(URL, {"capability": "chat.echo@1"})
    assert second.status_code == 201 and second.json()["id"] != first["id"]


def test_another_session_gets_a_credential_of_its_own(operator):
    first = operator.post(URL, {"capability": "chat.echo@1"}).json()
    elsewhere = Client()
    elsewhere.force_login(User.objects.get(username="ops"))
    second = elsewhere.post(URL, {"capability": "chat.echo@1"}).json()
    assert second["id"] != first["id"] and second["credential"] != first["credential"]


def test_logging_out_revokes_the_sessions_playground_credentials(operator):
    minted = operator.post(URL, {"capability": "chat.echo@1"}).json()
    kept, _ = ClientCredential.objects.mint(name="app", scopes=["chat.echo@1"])
    operator.post("/logout/")
    assert ClientCredential.objects.get(pk=minted["id"]).revoked_at is not None
    assert ClientCredential.objects.get(pk=kept.pk).revoked_at is None


def test_it_refuses_without_an_operator_session(client):
    Capability.objects.create(name="chat.echo@1")
    answer = client.post(URL, {"capability": "chat.echo@1"})
    assert answer.status_code == 401 and answer.json()["code"] == "NOT_AUTHENTICATED"
    client.force_login(User.objects.create_user("viewer"))  # logged in, not staff
    answer = client.post(URL, {"capability": "chat.echo@1"})
    assert answer.status_code == 403 and answer.json()["code"] == "PERMISSION_DENIED"
    assert not ClientCredential.objects.exists()


def test_it_refuses_a_post_without_the_csrf_token():
    Capability.objects.create(name="chat.echo@1")
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(User.objects.create_user("ops", is_staff=True))
    answer = checked.post(URL, {"capability": "chat.echo@1"})
    assert answer.status_code == 403 and answer.json()["code"] == "CSRF_FAILED"
    assert not ClientCredential.objects.exists()


@pytest.mark.parametrize(
    ("form", "why"),
    [
        ({"capability": "chat.missing@1"}, "capability: no capability is named 'chat.missing@1'"),
        ({"capability": "chat.echo@1 "}, "capability:"),
        ({"capability": "CHAT.echo@1"}, "capability:"),
        ({}, "capability:"),
        ({"capability": "chat.echo@1", "project": "search"}, "bound for no project, not 'search'"),
    ],
)
def test_it_refuses_what_it_does_not_offer_by_name(operator, form, why):
    answer = operator.post(URL, form)
    assert answer.status_code == 400 and answer.json()["code"] == "VALIDATION_ERROR"
    assert why in answer.json()["message"]
    assert not ClientCredential.objects.exists()


def test_a_get_is_refused_in_the_envelope(operator):
    answer = operator.get(URL)
    assert answer.status_code == 405 and answer.json()["code"] == "METHOD_NOT_ALLOWED"


def test_a_capability_bound_only_for_a_project_is_tried_as_that_project(operator):
    server = running_server(make_node(name="pg-node")[0], "echo-p", 9)
    chat = Capability.objects.get(name="chat.echo@1")
    RoutingTier.objects.create(capability=chat, server=server, project="shop")
    refused = operator.post(URL, {"capability": "chat.echo@1"}).json()
    assert refused["code"] == "VALIDATION_ERROR"
    assert refused["message"] == (
        "project: the routing tiers of chat.echo@1 are bound for projects shop, not ''."
    )
    body = operator.post(URL, {"capability": "chat.echo@1", "project": "shop"}).json()
    assert ClientCredential.objects.get(pk=body["id"]).project == "shop"


def test_the_page_offers_each_capability_with_its_endpoints(operator):
    page = operator.get("/clusters/playground/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="playground"' in html and "chat.echo@1 (no running backend)" in html
    offers = {o.name: o for o in playground.offers()}
    # No backend running: every endpoint is offered, and the gateway's refusal will say why.
    assert offers["chat.echo@1"].endpoints == ["chat", "completions", "embeddings"]
    assert 'aria-current="page"' in html and ">Playground</a>" in html


def test_the_page_needs_an_operator(client):
    assert client.get("/clusters/playground/").status_code == 302


def test_playground_credentials_are_labelled_and_hidden_once_expired(operator):
    minted = operator.post(URL, {"capability": "chat.echo@1"}).json()
    page = operator.get("/clusters/").content.decode()
    assert "playground: ops" in page and ">playground</span>" in page
    listed = operator.get("/api/v1/client-credentials").json()
    assert [c["kind"] for c in listed["results"]] == ["playground"]
    with time_machine.travel(timezone.now() + timedelta(minutes=16)):
        page = operator.get("/clusters/").content.decode()
    assert "playground: ops" not in page
    assert ClientCredential.objects.filter(pk=minted["id"]).exists()  # kept: its usage keeps its name
