"""The dashboard shell in a real browser: Debian's chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from tests.fixtures import ARTIFACTS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without these, chromium spends its start-up reaching for Google's hosts on a closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [pytest.mark.browser, pytest.mark.stack]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not shutil.which("chromium") and not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is not installed; `make test` installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls (creating the
    # user) are still plain synchronous code, which Django would otherwise refuse here.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            yield launched
            launched.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


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
