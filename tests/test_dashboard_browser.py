"""The dashboard shell in a real browser: Debian's chromium driven by Playwright."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tests.fixtures import ARTIFACTS

pytestmark = [pytest.mark.browser, pytest.mark.stack]


@pytest.mark.django_db(transaction=True)
def test_an_operator_logs_in_and_sees_the_overview(live_web, browser):
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(live_web.url + "/")
        assert "/login/" in page.url
        page.fill("#id_username", "ops")
        page.fill("#id_password", "wrong-password")
        page.click("button[type=submit]")
        assert page.locator("[role=alert]").is_visible()

        page.fill("#id_username", "ops")
        page.fill("#id_password", "correct-horse-battery-9")
        page.click("button[type=submit]")
        page.wait_for_selector("h1:has-text('Overview')")
        assert page.locator(".card:has-text('Database') .state").inner_text() == "reachable"
        assert page.locator(".card:has-text('Broker') .state").inner_text() == "reachable"
        assert page.locator("nav.sidebar").inner_text().count("\n") >= 7
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)
    finally:
        page.close()


@pytest.mark.django_db(transaction=True)
def test_a_non_staff_account_is_told_it_is_not_an_operator(live_web, browser):
    User.objects.create_user("viewer", password="correct-horse-battery-9", is_staff=False)
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(live_web.url + "/login/")
        page.fill("#id_username", "viewer")
        page.fill("#id_password", "correct-horse-battery-9")
        page.click("button[type=submit]")
        assert "not an operator" in page.locator("[role=alert]").inner_text()
    finally:
        page.close()
