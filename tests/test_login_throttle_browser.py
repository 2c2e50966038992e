"""The log-in lockout through the real web process (gunicorn, ASGI, every middleware) in a real browser."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from tests.fixtures import ARTIFACTS

pytestmark = [pytest.mark.browser, pytest.mark.stack]


@pytest.mark.django_db(transaction=True)
def test_an_operator_who_mistypes_too_often_is_told_until_when_and_the_right_password_waits(
    live_web, browser
):
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(live_web.url + "/login/")
        for i in range(settings.LOGIN_FAILURE_LIMIT):
            page.fill("#id_username", "ops")
            page.fill("#id_password", f"wrong-password-{i}")
            page.click("button[type=submit]")
        refusal = page.locator("#refusal")
        assert "LOGIN_LOCKED_OUT" in refusal.inner_text()
        assert "UTC" in refusal.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "login-locked-out.png"), full_page=True)

        page.click("text=Back to the log-in page")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "correct-horse-battery-9")
        page.click("button[type=submit]")
        assert "LOGIN_LOCKED_OUT" in page.locator("#refusal").inner_text()
        assert "/login/" in page.url
    finally:
        page.close()
