"""Default limits per project (issue 18, item 2): a limit a credential leaves empty is its project's
default; its own value overrides it. Set through the API (validated, named refusals) and the admin, shown
on the credential's page as "from project", applied by every gateway process through the routing table's
change notice. The live test runs the real gateway, echo engine, Redis and PostgreSQL."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.contrib.auth.models import User

from apps.clusters.bindings import VERSION_KEY, routing_redis
from apps.clusters.models import ClientCredential, ProjectLimits
from apps.clusters.tests.factories import bind, credential, echo_backend, loopback_node, running_server
from apps.gateway.limits import Limits
from apps.gateway.routing import build_table
from apps.gateway.tests.test_limits import chat, limited
from tests.fixtures import clear_usage, wait_until

URL = "/api/v1/project-limits"
NO_LIMITS = dict.fromkeys(
    ("requests_per_minute", "tokens_per_minute", "max_concurrent", "tokens_per_day", "tokens_per_month")
)


def grant_of(key: str):
    return next(g for g in build_table().grants.values() if g.id == str(_pk(key)))


def _pk(key: str) -> int:
    return ClientCredential.objects.get(display_prefix=key[:12]).pk


@pytest.mark.django_db
def test_a_credentials_empty_limits_are_its_projects_defaults_and_its_own_override_them(operator_client):
    answer = operator_client.post(
        URL, {"project": "shop", "requests_per_minute": 3, "tokens_per_day": 1000}, format="json"
    )
    assert answer.status_code == 201, answer.content
    inherits = credential(["chat.echo@1"], project="shop")
    overrides = credential(["chat.echo@1"], project="shop", limits={"requests_per_minute": 10})
    elsewhere = credential(["chat.echo@1"], project="other")
    unbound = credential(["chat.echo@1"])
    assert grant_of(inherits).limits == Limits(requests_per_minute=3, tokens_per_day=1000)
    assert grant_of(overrides).limits == Limits(requests_per_minute=10, tokens_per_day=1000)
    # No defaults for another project or for a credential without one: no limits, no Redis round trip.
    assert grant_of(elsewhere).limits is None and grant_of(unbound).limits is None
    # The API says which limits apply and where each comes from.
    use = operator_client.get(f"/api/v1/client-credentials/{_pk(overrides)}/use").json()
    assert use["limits"] == {**NO_LIMITS, "requests_per_minute": 10, "tokens_per_day": 1000}
    assert use["limits_from"] == {
        **dict.fromkeys(NO_LIMITS, ""),
        "requests_per_minute": "credential",
        "tokens_per_day": "project",
    }


@pytest.mark.django_db(transaction=True)
def test_a_change_of_a_projects_defaults_moves_the_routing_version(operator_client):
    before = int(routing_redis().get(VERSION_KEY) or 0)
    created = operator_client.post(URL, {"project": "shop", "max_concurrent": 2}, format="json").json()
    assert int(routing_redis().get(VERSION_KEY) or 0) > before
    before = int(routing_redis().get(VERSION_KEY) or 0)
    operator_client.delete(f"{URL}/{created['id']}")
    assert int(routing_redis().get(VERSION_KEY) or 0) > before


@pytest.mark.django_db
def test_project_defaults_are_read_set_and_removed_through_the_api(operator_client):
    created = operator_client.post(URL, {"project": "shop", "requests_per_minute": 3}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body == {"id": body["id"], "project": "shop", **NO_LIMITS, "requests_per_minute": 3}
    assert operator_client.get(URL, {"project": "shop"}).json()["results"] == [body]
    assert operator_client.get(URL, {"project": "none"}).json()["results"] == []
    changed = operator_client.put(
        f"{URL}/{body['id']}", {"project": "shop", **NO_LIMITS, "tokens_per_month": 10**6}, format="json"
    )
    assert changed.status_code == 200
    assert changed.json()["tokens_per_month"] == 10**6 and changed.json()["requests_per_minute"] is None
    assert operator_client.delete(f"{URL}/{body['id']}").status_code == 204
    assert not ProjectLimits.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"project": "shop", "requests_per_minute": 0}, "requests_per_minute"),
        ({"project": "shop", "max_concurrent": -1}, "max_concurrent"),
        ({"project": "shop", "requests_per_minute": 2**31}, "requests_per_minute"),
        ({"project": "shop", "tokens_per_day": 2**63}, "tokens_per_day"),
        ({"project": "shop", "tokens_per_minute": "many"}, "tokens_per_minute"),
        ({"project": ""}, "project"),
        ({"project": " shop"}, "project"),
        ({"project": "x" * 64}, "project"),
        ({"requests_per_minute": 3}, "project"),
    ],
)
def test_bad_project_defaults_are_refused_by_name(operator_client, body, field):
    answer = operator_client.post(URL, body, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "VALIDATION_ERROR"
    assert field in answer.json()["message"]
    assert not ProjectLimits.objects.exists()


@pytest.mark.django_db
def test_a_project_has_one_set_of_defaults(operator_client):
    assert operator_client.post(URL, {"project": "shop"}, format="json").status_code == 201
    again = operator_client.post(URL, {"project": "shop", "max_concurrent": 1}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "NAME_TAKEN"
    assert "default limits already" in again.json()["message"]
    assert ProjectLimits.objects.count() == 1


@pytest.mark.django_db
def test_project_defaults_need_the_operator(anonymous_client):
    answer = anonymous_client.post(URL, {"project": "shop"}, format="json")
    assert answer.status_code == 401 and answer.json()["code"] == "NOT_AUTHENTICATED"


@pytest.mark.django_db
def test_the_credential_page_says_which_limits_come_from_the_project(client):
    ProjectLimits.objects.create(project="shop", requests_per_minute=3, tokens_per_day=500)
    key = credential(["chat.echo@1"], project="shop", limits={"tokens_per_day": 900})
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get(f"/clusters/credentials/{_pk(key)}/").content.decode()
    applies = page.split('id="applies-requests_per_minute">')[1].split("</td>")[0]
    assert applies.startswith("3") and "from project" in applies
    own = page.split('id="applies-tokens_per_day">')[1].split("</td>")[0]
    assert own == "900"  # its own value, not the project's 500
    assert 'placeholder="project default: 3"' in page
    assert page.split('id="applies-max_concurrent">')[1].startswith("none")
    assert 'id="project-defaults"' in page


@pytest.mark.django_db
def test_the_admin_refuses_a_zero_default(client):
    client.force_login(User.objects.create_superuser("root", email="", password="x"))
    form = {"project": "shop", "requests_per_minute": "0"}
    page = client.post("/admin/clusters/projectlimits/add/", form)
    assert page.status_code == 200 and not ProjectLimits.objects.exists()  # the form again, with its error
    saved = client.post("/admin/clusters/projectlimits/add/", {"project": "shop", "requests_per_minute": "3"})
    assert saved.status_code == 302
    assert ProjectLimits.objects.get(project="shop").requests_per_minute == 3


@pytest.mark.stack
@pytest.mark.django_db(transaction=True)
def test_a_project_default_of_three_a_minute_limits_a_credential_without_its_own(
    live_web, operator_client, tmp_path
):
    clear_usage()
    process, port = echo_backend(tmp_path, "echo-pl")
    try:
        bind("chat.echo@1", server=running_server(loopback_node(), "echo-pl", port))
        key = credential(["chat.echo@1"], project="shop")
        assert wait_until(lambda: chat(live_web.url, key).status_code == 200, 10)  # no limit yet
        answer = operator_client.post(URL, {"project": "shop", "requests_per_minute": 3}, format="json")
        assert answer.status_code == 201
        time.sleep(1.5)  # every gateway process has the default within a second (the change notice)
        # Calls are counted only while a credential has limits: the unlimited call above is not in the
        # window, so three more are admitted.
        answers = [chat(live_web.url, key) for _ in range(4)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert answers[3].json()["code"] == "RATE_LIMITED"
        assert "3 requests per minute" in answers[3].json()["message"]
        assert 1 <= int(answers[3].headers["retry-after"]) <= 60
        # The credential's own value overrides the project's: 5 a minute, 3 used, 2 more.
        limited(key, operator_client, requests_per_minute=5)
        time.sleep(1.5)
        assert [chat(live_web.url, key).status_code for _ in range(3)] == [200, 200, 429]
    finally:
        os.killpg(process.process.pid, signal.SIGTERM)
        process.process.wait(10)
