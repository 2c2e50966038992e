"""In Chromium: an operator opens a credential from the Clusters page, sets its limits, sees what it uses
against them, watches a call refused at the limit, and finds the calls on the Usage page."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.contrib.auth.models import User

from apps.clusters.models import ClientCredential
from apps.clusters.tests.factories import bind, echo_backend, loopback_node, running_server
from apps.gateway.tests.test_admission_http import chat
from apps.gateway.tests.test_usage import counted
from apps.observability.sampling import roll_up_usage
from tests.fixtures import ARTIFACTS, clear_usage, log_in, wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.stack,
    pytest.mark.django_db(databases=["default", "observability"], transaction=True),
]


def test_an_operator_limits_a_credential_and_reads_its_usage(live_web, browser, tmp_path):
    clear_usage()
    process, port = echo_backend(tmp_path, "echo-b")
    try:
        bind("chat.echo@1", server=running_server(loopback_node(), "echo-b", port))
        shop, key = ClientCredential.objects.mint(name="web shop", scopes=["chat.echo@1"])
        pk = shop.pk
        User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")

        def call() -> int:
            return chat(live_web.url, key, "chat.echo@1", "hi", timeout=10).status_code

        page = browser.new_page()
        try:
            log_in(page, live_web.url, "ops", "correct-horse-battery-9")
            page.goto(f"{live_web.url}/clusters/")
            page.click("#credentials >> text=web shop")
            page.wait_for_selector("#credential-limits")
            # Past its column's bound: refused by name (the browser itself refuses anything under 1).
            page.fill("#requests_per_minute", "3000000000")
            page.click("#credential-limits button[type=submit]")
            page.wait_for_selector("text=VALIDATION_ERROR")
            assert ClientCredential.objects.get(pk=pk).requests_per_minute is None
            page.fill("#requests_per_minute", "2")
            page.click("#credential-limits button[type=submit]")
            page.wait_for_selector("text=Limits of web shop saved")
            assert ClientCredential.objects.get(pk=pk).requests_per_minute == 2

            time.sleep(1.5)  # every gateway process has the limit within a second
            assert [call(), call(), call()] == [200, 200, 429]
            page.reload()
            assert page.inner_text("#use-requests_per_minute").startswith("2 in the last 60 s of 2")

            # Flushed within a second; then rolled up as the sampling task does once the minute is over.
            assert wait_until(lambda: counted(str(pk))["chat.echo@1:requests"] == 3, 10)
            roll_up_usage(time.time() + 120)
            assert _rolled(pk)
            page.goto(f"{live_web.url}/clusters/")
            page.click("#usage-link")
            row = page.locator("#usage-totals tr", has_text="web shop")
            assert row.count() == 1
            # 3 calls, 1 of them refused (an error); the echo engine's tokens for the two answered.
            assert row.locator("td").nth(2).inner_text() == "3"
            assert row.locator("td").nth(3).inner_text() == "1"
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "usage.png"), full_page=True)
        finally:
            page.close()
    finally:
        os.killpg(process.process.pid, signal.SIGTERM)
        process.process.wait(10)


def _rolled(pk: int) -> bool:
    from apps.observability.models import UsageSample

    return sum(r.requests for r in UsageSample.objects.filter(credential=str(pk))) == 3
