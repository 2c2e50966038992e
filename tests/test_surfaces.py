"""Nothing answers without its credential: every operator API route is 401 without a key, every console
page sends a browser without a session to the log-in page, and each route with a credential of its own
refuses without it. Routes come from the URL resolver (tests/surfaces.py): a new app's routes are
checked here with no edit."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests import surfaces

pytestmark = pytest.mark.django_db

API_CALLS = [(route, method) for route in surfaces.api_routes() for method in route.methods]
DASHBOARD_CALLS = [(route, method) for route in surfaces.dashboard_routes() for method in ("get", "post")]


@pytest.mark.parametrize(("route", "method"), API_CALLS, ids=[f"{m.upper()} {r.url}" for r, m in API_CALLS])
def test_an_api_route_is_refused_without_the_operator_key(route, method):
    response = getattr(APIClient(), method)(route.url, {}, format="json")
    surfaces.assert_refused_without_key(response)


@pytest.mark.parametrize(
    ("route", "method"), DASHBOARD_CALLS, ids=[f"{m.upper()} {r.url}" for r, m in DASHBOARD_CALLS]
)
def test_a_console_route_sends_a_browser_without_a_session_to_log_in(route, method):
    response = getattr(Client(), method)(route.url)
    surfaces.assert_sends_to_login(response, route.url)


def test_the_walk_finds_every_app_s_routes():
    # Guards the walk itself: an empty or partial enumeration would make the two tests above vacuous.
    api = {route.url.split("/")[3] for route in surfaces.api_routes()}
    console = {route.url.split("/")[1] for route in surfaces.dashboard_routes()}
    assert {"system", "nodes", "alerts", "servers", "clusters", "artifacts", "backups"} <= api
    assert {"embedding-spaces", "cutovers", "traffic", "schema"} <= api
    assert {"", "work", "nodes", "alerts", "servers", "clusters", "artifacts", "backups"} <= console
    assert {"observability", "migrations"} <= console
    assert len(API_CALLS) > 100 and len(DASHBOARD_CALLS) > 100


def test_the_filled_urls_keep_their_parameters():
    by_name = {route.name: route.url for route in surfaces.routes()}
    assert by_name["api:node-detail"] == "/api/v1/nodes/1"
    assert by_name["api:node-telemetry"] == "/api/v1/nodes/00000000-0000-4000-8000-000000000001/telemetry"
    assert by_name["servers:detail"] == "/servers/00000000-0000-4000-8000-000000000001/"
    assert by_name["artifacts:action"] == "/artifacts/1/sample"


def test_every_exception_is_a_route_that_exists():
    names = {route.name for route in surfaces.routes()}
    assert set(surfaces.PUBLIC) | set(surfaces.OWN_CREDENTIALS) <= names


@pytest.mark.parametrize("url", ["/healthz"])
def test_the_liveness_probe_is_public(url):
    assert Client().get(url).status_code == 200


def test_the_login_page_is_public():
    assert Client().get("/login/").status_code == 200


def test_logging_out_without_a_session_goes_to_the_login_page():
    response = Client().post("/logout/")
    assert response.status_code == 302 and response["Location"] == "/login/"


def test_enrollment_refuses_an_unknown_token():
    body = {
        "token": "mfe_not-a-real-token",
        "name": "gpu-box-1",
        "accelerator": "nvidia",
        "agent_version": "0.1.0",
        "agent_url": "http://10.0.0.5:8471",
    }
    response = APIClient().post("/api/v1/agent/enroll", body, format="json")
    surfaces.envelope(response, 401, "ENROLLMENT_TOKEN_UNKNOWN")


def test_the_api_browser_sends_a_browser_without_a_session_to_log_in():
    surfaces.assert_sends_to_login(Client().get("/api/v1/docs/"), "/api/v1/docs/")


def test_the_api_browser_judges_a_wrong_key_as_the_api_does():
    response = Client().get("/api/v1/docs/", HTTP_AUTHORIZATION="Bearer not-the-key-at-all")
    surfaces.envelope(response, 401, "NOT_AUTHENTICATED")


def test_metrics_are_refused_without_the_operator_key():
    response = Client().get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer ")


def test_the_playground_credential_is_refused_without_a_staff_session():
    surfaces.envelope(Client().post("/clusters/playground/credential"), 401, "NOT_AUTHENTICATED")
    assert Client().get("/clusters/playground/credential").status_code == 405  # POST only, never a key


def test_the_admin_sends_a_browser_without_a_session_to_its_own_login():
    for url in ("/admin/", "/admin/nodes/node/", "/admin/auth/user/1/change/"):
        response = Client().get(url)
        assert response.status_code == 302, url
        assert response["Location"] == f"/admin/login/?next={url}", url


def test_the_checks_catch_a_route_that_forgot_its_guard(settings):
    settings.ROOT_URLCONF = "tests.urls_surfaces"
    [api] = surfaces.api_routes()
    [page] = surfaces.dashboard_routes()
    assert (api.url, api.methods, page.url, page.methods) == (
        "/api/v1/open/1",
        ("get",),
        "/open/",
        ("get", "post"),
    )
    with pytest.raises(AssertionError):
        surfaces.assert_refused_without_key(APIClient().get(api.url))
    with pytest.raises(AssertionError):
        surfaces.assert_sends_to_login(Client().get(page.url), page.url)
