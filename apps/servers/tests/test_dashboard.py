"""Model servers in the dashboard and the admin: place with the scheduler's explanation, detail, stop."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.servers.models import ModelServer
from apps.servers.tests.factories import cpu_node, gpu_node
from tests.fixtures import ARTIFACTS, log_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


def test_a_refusal_is_shown_with_every_nodes_reason_and_nothing_is_created(staff):
    gpu_node("full", [(24, 22, 0)])
    page = staff.post(
        "/servers/new/",
        {"name": "big", "profile": "test-echo-gpu", "model": "m", "gpus": "1", "weights_gib": "8"},
    )
    assert page.status_code == 200
    body = page.content.decode()
    assert "CAPACITY_CONSTRAINED" in body
    assert "GPU 0: 24.0 GiB total - 22.0 GiB used - 0.0 GiB reserved = 2.0 GiB" in body
    assert not ModelServer.objects.exists()


def test_placing_from_the_dashboard_shows_the_placement_and_history(staff):
    cpu_node("cpu-a", available_gib=8)
    page = staff.post("/servers/new/", {"name": "echo", "profile": "test-echo", "model": "m"}, follow=True)
    assert page.status_code == 200
    server = ModelServer.objects.get(name="echo")
    body = page.content.decode()
    assert "echo placed on cpu-a; starting." in body
    assert 'id="placement"' in body and "fits on RAM" in body
    assert "placing → starting" in body
    stopped = staff.post(f"/servers/{server.pk}/stop", follow=True)
    assert "Stopping echo." in stopped.content.decode()
    server.refresh_from_db()
    assert server.state == "stopping"
    listing = staff.get("/servers/?state=stopping").content.decode()
    assert "echo" in listing


def test_bad_form_input_is_named(staff):
    page = staff.post(
        "/servers/new/", {"name": "has space", "profile": "test-echo", "model": "m", "weights_gib": "x"}
    )
    body = page.content.decode()
    assert "Enter a number." in body
    assert not ModelServer.objects.exists()


def test_admin_lists_servers_and_offers_no_add(client):
    cpu_node("cpu-a", available_gib=8)
    client.force_login(User.objects.create_superuser("root-ops", email="", password="x-long-password-1"))
    client.post("/servers/new/", {"name": "echo", "profile": "test-echo", "model": "m"})
    page = client.get("/admin/servers/modelserver/")
    assert page.status_code == 200 and b"echo" in page.content
    assert client.get("/admin/servers/modelserver/add/").status_code == 403


@pytest.mark.browser
@pytest.mark.stack
@pytest.mark.django_db(transaction=True)
def test_the_refusal_explanation_in_a_real_browser(live_web, browser):
    User.objects.create_superuser("ops2", email="", password="correct-horse-battery-9")
    gpu_node("pressured", [(24, 20, 1)])
    page = browser.new_page()
    try:
        log_in(page, live_web.url, "ops2", "correct-horse-battery-9")
        page.goto(live_web.url + "/servers/new/")
        page.fill("#name", "llm")
        page.select_option("#profile", "test-echo-gpu")
        page.fill("#model", "m")
        page.fill("#gpus", "1")
        page.fill("#weights_gib", "8")
        page.click("button:has-text('Place and start')")
        refusal = page.locator("#refusal")
        refusal.wait_for()
        text = refusal.inner_text()
        assert "CAPACITY_CONSTRAINED" in text and "pressured" in text and "= 4.0 GiB" in text
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "placement-refused.png"), full_page=True)
    finally:
        page.close()
