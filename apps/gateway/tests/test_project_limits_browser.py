"""In Chromium: an operator opens a credential whose project has no defaults, follows its link to the
Project limits page (the form filled in with the project), is refused by name for a zero, sets one
request a minute, sees the gateway refuse the credential's second call, changes the default on the
project's page, and removes it."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.contrib.auth.models import User

from apps.clusters.models import ClientCredential, ProjectLimits
from apps.clusters.tests.factories import bind, echo_backend, loopback_node, running_server
from apps.gateway.tests.test_admission_http import chat
from tests.fixtures import ARTIFACTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.stack, pytest.mark.django_db(transaction=True)]


def test_an_operator_sets_changes_and_removes_a_projects_default_limits(live_web, browser, tmp_path):
    process, port = echo_backend(tmp_path, "echo-pd")
    try:
        bind("chat.echo@1", server=running_server(loopback_node(), "echo-pd", port))
        shop, key = ClientCredential.objects.mint(name="web shop", scopes=["chat.echo@1"], project="shop")
        User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")

        def call() -> int:
            return chat(live_web.url, key, "chat.echo@1", "hi", timeout=10).status_code

        page = browser.new_page()
        try:
            log_in(page, live_web.url, "ops", "correct-horse-battery-9")
            page.goto(f"{live_web.url}/clusters/credentials/{shop.pk}/")
            page.click("#project-defaults")  # "set them": the project has no defaults yet
            page.wait_for_selector("#create-project-limits")
            assert page.input_value("#project") == "shop"
            assert page.locator('nav a[aria-current="page"]').inner_text() == "Project limits"
            # Zero is refused by name, as the API refuses it (the browser's own min=1 check bypassed).
            page.eval_on_selector("#requests_per_minute", "e => e.removeAttribute('min')")
            page.fill("#requests_per_minute", "0")
            page.click("#create-project-limits button[type=submit]")
            page.wait_for_selector("text=VALIDATION_ERROR: requests_per_minute:")
            assert not ProjectLimits.objects.exists()
            assert page.input_value("#project") == "shop"  # back to the form, the project kept
            page.fill("#requests_per_minute", "1")
            page.click("#create-project-limits button[type=submit]")
            page.wait_for_selector("text=Default limits of project shop saved")
            row = page.locator("#project-limits tbody tr", has_text="shop")
            assert row.locator("td").nth(1).inner_text() == "1"
            assert row.locator("td").nth(6).inner_text() == "1"  # the one credential of the project

            time.sleep(1.5)  # every gateway process has the default within a second (the change notice)
            assert [call(), call()] == [200, 429]

            # The credential's page now says the limit is the project's, and links to its defaults.
            page.goto(f"{live_web.url}/clusters/credentials/{shop.pk}/")
            assert "from project" in page.inner_text("#applies-requests_per_minute")
            page.click("#project-defaults")
            page.wait_for_selector("#edit-project-limits")
            page.fill("#requests_per_minute", "")
            page.fill("#max_concurrent", "4")
            page.click("#edit-project-limits button[type=submit]")
            page.wait_for_selector("text=Default limits of project shop saved")
            saved = ProjectLimits.objects.get(project="shop")
            assert (saved.requests_per_minute, saved.max_concurrent) == (None, 4)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "project-limits.png"), full_page=True)
            page.click("#delete-project-limits button[type=submit]")
            page.wait_for_selector("text=Default limits of project shop removed")
            assert not ProjectLimits.objects.exists()
            assert "No project has default limits" in page.inner_text("#project-limits")
        finally:
            page.close()
    finally:
        os.killpg(process.process.pid, signal.SIGTERM)
        process.process.wait(10)
