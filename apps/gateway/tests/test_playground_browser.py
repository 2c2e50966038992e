"""In Chromium: an operator opens the Playground, streams a chat from the echo capability through the real
gateway (the words appear one by one, before the answer ends), sends an embeddings request, and sees
refusals by their code and message. Real gunicorn, echo engine, PostgreSQL and Redis."""

from __future__ import annotations

import os
import signal

import pytest
from django.contrib.auth.models import User

from apps.clusters.models import Capability, ClientCredential
from apps.clusters.tests.factories import bind, echo_backend, loopback_node, running_server
from tests.fixtures import ARTIFACTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.stack, pytest.mark.django_db(transaction=True)]


def test_an_operator_streams_a_chat_and_embeds_from_the_playground(live_web, browser, tmp_path):
    process, port = echo_backend(tmp_path, "echo-pg")
    try:
        bind("chat.echo@1", server=running_server(loopback_node(), "echo-pg", port))
        Capability.objects.create(name="chat.idle@1")  # no routing tier: nothing serves it
        User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
        page = browser.new_page()
        try:
            log_in(page, live_web.url, "ops", "correct-horse-battery-9")
            page.click("nav >> text=Playground")
            page.wait_for_selector("#playground")
            page.select_option("#pg-capability", "chat.echo@1")
            # The echo profile serves chat and embeddings, not completions: only those are offered.
            offered = page.eval_on_selector_all("#pg-endpoint option", "options => options.map(o => o.value)")
            assert offered == ["chat", "embeddings"]
            page.select_option("#pg-endpoint", "chat")
            assert page.is_checked("#pg-stream")
            page.fill("#pg-message", "one two three four five six")
            page.click("#pg-send")
            # Streamed: some words shown while the answer is still coming (the engine pauses 0.2 s a word).
            page.wait_for_function(
                "() => document.getElementById('pg-state').textContent === 'streaming'"
                " && document.getElementById('pg-answer').textContent.startsWith('echo:')"
                " && !document.getElementById('pg-answer').textContent.endsWith('six')",
                timeout=15000,
            )
            page.wait_for_selector("#pg-state:text-is('done')", timeout=15000)
            assert page.inner_text("#pg-answer") == "echo: one two three four five six"
            assert int(page.get_attribute("#pg-answer", "data-chunks")) == 7  # one event a word
            assert page.inner_text("#pg-model") == "chat.echo@1"  # the capability, not the engine's name
            assert page.inner_text("#pg-backend") == "echo-pg"
            assert page.inner_text("#pg-usage") == "6 prompt, 7 completion, 13 total tokens"
            assert "first token" in page.inner_text("#pg-time")
            assert "minted" in page.inner_text("#pg-credential")
            minted = ClientCredential.objects.get(kind="playground")
            assert minted.scopes == ["chat.echo@1"] and minted.created_by == User.objects.get(username="ops")

            page.select_option("#pg-endpoint", "embeddings")
            assert not page.is_visible("#pg-stream")
            page.fill("#pg-message", "first text\nsecond text")
            page.click("#pg-send")
            page.wait_for_selector("#pg-state:text-is('done')", timeout=15000)
            assert page.inner_text("#pg-answer").startswith("2 vectors of 8 dimensions")
            assert page.inner_text("#pg-usage") == "2 prompt, 2 total tokens"
            assert "reused" in page.inner_text("#pg-credential")  # the same credential, not one per click
            assert ClientCredential.objects.filter(kind="playground").count() == 1
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)

            # The engine refusing the input: the gateway's envelope, shown by its code and message.
            page.fill("#pg-message", "__status_400__")
            page.click("#pg-send")
            page.wait_for_selector("#pg-state:text-is('refused')", timeout=15000)
            assert page.inner_text("#pg-error-code") == "UPSTREAM_REJECTED"
            assert "asked to fail with 400" in page.inner_text("#pg-error-message")

            # Revoked (by an operator, or a log-out elsewhere): the page mints a fresh one, never reuses it.
            key_prefix = minted.display_prefix
            minted.revoke()
            page.fill("#pg-message", "again")
            page.click("#pg-send")
            page.wait_for_selector("#pg-state:text-is('done')", timeout=15000)
            assert "minted" in page.inner_text("#pg-credential")
            assert key_prefix not in page.inner_text("#pg-credential")

            # A capability nothing serves: offered, marked, and the gateway's refusal shown by name.
            page.select_option("#pg-capability", "chat.idle@1")
            assert "No backend runs chat.idle@1" in page.inner_text("#pg-about")
            page.select_option("#pg-endpoint", "chat")
            page.click("#pg-send")
            page.wait_for_selector("#pg-state:text-is('refused')", timeout=15000)
            assert page.inner_text("#pg-error-code") == "NO_ELIGIBLE_NODE"
        finally:
            page.close()
    finally:
        os.killpg(process.process.pid, signal.SIGTERM)
        process.process.wait(10)
