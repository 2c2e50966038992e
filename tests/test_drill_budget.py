"""A bad day for a token budget (issue 47): Redis frozen (SIGSTOP) while a budgeted client streams with
`"stream_options": {}`, which the gateway did not meter before issue 47.

A real gunicorn web process on the test database and on a Redis of this test's own (the shared test
Redis is never frozen), the real echo engine, the `openai` package. While Redis is frozen the limits
cannot be checked: the calls are admitted, the web log says so once, and the credential's page and
`/use` say so. The tokens of those calls wait in the web process and reach Redis once it answers again,
and the budget then refuses the next call: the freeze lets the client past its budget for as long as it
lasts, and no longer.

How long to freeze: every Redis call of the web process gives up after 0.5 s at most (the admission
script's and the routing version's reply, apps/gateway/resp.py and apps/clusters/bindings.py; the flush's
after 0.3 s), and a call admitted without its check is the documented fail-open. So the freeze only has to
outlast those timeouts a few times over: it lasts until the client has streamed three calls admitted
without a check, a few seconds, not the 30 s of the issue's drill, which would show nothing more."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from openai import APIStatusError, OpenAI

from apps.clusters.models import ClientCredential
from apps.clusters.tests.factories import bind, credential, echo_backend, loopback_node, running_server
from tests.fixtures import LiveWeb, start_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

# "a b c" to the echo engine: 3 prompt and 4 completion tokens ("echo: a b c").
TOKENS_A_CALL = 7
BUDGET = 3 * TOKENS_A_CALL
NOT_ENFORCED = "credential limits are not enforced until it answers"


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[int]:
    process, port = echo_backend(tmp_path, "echo-d")
    yield port
    os.killpg(process.process.pid, signal.SIGTERM)
    process.process.wait(10)


class Client:
    """A budgeted client streaming one call after another with `"stream_options": {}`; what it got."""

    def __init__(self, web: LiveWeb, key: str) -> None:
        self.sdk = OpenAI(base_url=web.url + "/v1", api_key=key, max_retries=0, timeout=30)
        self.answers: list[tuple[int, str]] = []  # (status, refusal code)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def call(self) -> tuple[int, str]:
        try:
            chunks = self.sdk.chat.completions.create(
                model="chat.echo@1",
                messages=[{"role": "user", "content": "a b c"}],
                stream=True,
                stream_options={},
            )
            # It did not ask for usage: no usage chunk (no choices) reaches it.
            return 200, "" if all(c.choices for c in chunks) else "a usage chunk"
        except APIStatusError as exc:
            return exc.status_code, exc.body.get("code", "") if isinstance(exc.body, dict) else ""

    def _run(self) -> None:
        while not self.stop.is_set():
            self.answers.append(self.call())

    def admitted(self, since: int = 0) -> int:
        return sum(1 for status, _ in self.answers[since:] if status == 200)


def test_a_budget_holds_when_redis_returns_from_a_freeze(own_redis, echo, tmp_path, settings, client):
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-d", echo))
    key = credential(["chat.echo@1"])
    credentials = ClientCredential.objects.filter(display_prefix=key[:12])
    credentials.update(tokens_per_day=BUDGET)
    pk = credentials.get().pk
    # Made before the web process starts, so its first routing table has the credential and its budget.
    web = start_web(tmp_path / "web.log", MODELFORGE_REDIS_URL=own_redis.url, MODELFORGE_LOG_LEVEL="INFO")
    operator = {"Authorization": f"Bearer {django_settings.OPERATOR_API_KEY}"}

    def use() -> dict[str, Any]:
        answer = httpx.get(f"{web.url}/api/v1/client-credentials/{pk}/use", headers=operator, timeout=10)
        return dict(answer.json())

    streaming = Client(web, key)
    try:
        assert streaming.call() == (200, "")
        assert wait_until(lambda: use()["tokens_today"] == TOKENS_A_CALL, 10), use()
        streaming.thread.start()

        redis_pid = own_redis.pid()
        assert redis_pid is not None
        os.kill(redis_pid, signal.SIGSTOP)
        try:
            frozen_at = len(streaming.answers)
            assert wait_until(lambda: streaming.admitted(since=frozen_at) >= 3, 30), streaming.answers
            # The fail-open, as documented: logged once, and said on `/use` and the credential's page.
            assert web.process.log().count(NOT_ENFORCED) == 1, web.process.log()[-3000:]
            assert use()["limits_enforced"] is False
            settings.CELERY_BROKER_URL = own_redis.url  # the page reads the credential's use from Redis
            client.force_login(User.objects.create_user("ops", is_staff=True))
            page = client.get(f"/clusters/credentials/{pk}/").content.decode()
            assert 'id="limits-not-enforced"' in page
        finally:
            os.kill(redis_pid, signal.SIGCONT)

        # Redis back: the tokens counted while it was away reach it, and the budget refuses.
        assert wait_until(lambda: (429, "BUDGET_EXHAUSTED") in streaming.answers, 20), streaming.answers
        streaming.stop.set()
        streaming.thread.join(30)
        refused_at = streaming.answers.index((429, "BUDGET_EXHAUSTED"))
        assert set(streaming.answers[refused_at:]) == {(429, "BUDGET_EXHAUSTED")}
        assert streaming.call() == (429, "BUDGET_EXHAUSTED")
        # Every streamed call was metered, once.
        admitted = 1 + streaming.admitted()
        assert admitted > BUDGET // TOKENS_A_CALL
        assert wait_until(lambda: use()["tokens_today"] == admitted * TOKENS_A_CALL, 10), (use(), admitted)
        assert use()["limits_enforced"] is True
        log = web.process.log()
        assert log.count(NOT_ENFORCED) == 1
        assert "Redis reachable again: credential limits are enforced" in log
    finally:
        streaming.stop.set()
        if streaming.thread.is_alive():
            streaming.thread.join(30)
        web.process.stop()
