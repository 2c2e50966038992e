"""A frozen broker never holds an operator (issue 48, section 5).

A Redis that is SIGSTOPped keeps its TCP connections open and answers nothing: before issue 48 a publish
waited on it without a bound, and `POST /api/v1/backups` answered after 56 s in the drill. Every publish is
now bounded (MODELFORGE_BROKER_TIMEOUT_S, 1 s by default) and, when the broker does not answer in time,
falls back to the durable dispatch a refused connection already took: the row is the intent, the answer is
202, and the watchdog re-sends the task once the broker answers.

A real gunicorn web process on the test database and on a Redis of this test's own (the shared test Redis
is never frozen). The freeze lasts a few seconds: with a bound of 1 s that is enough to prove it."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
import redis
from django.conf import settings

from apps.backups.models import Backup
from apps.clusters.tests.factories import credential
from tests.fixtures import PYTHON, database_url, process_env, run_command, start_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

WATCH_LATER = (
    "from datetime import timedelta; from django.utils import timezone; from apps.core.work import watch; "
    "print(watch(timezone.now() + timedelta(seconds={seconds})))"
)


def test_a_backup_asked_for_while_redis_is_frozen_answers_at_once_and_is_sent_when_it_returns(
    own_redis, tmp_path
):
    (tmp_path / "backups").mkdir()
    env = {
        "MODELFORGE_REDIS_URL": own_redis.url,
        "MODELFORGE_BACKUP_ROOT": str(tmp_path / "backups"),
        "MODELFORGE_LOG_LEVEL": "INFO",
    }
    key = credential(["chat.none@1"])  # made first: the web process's first routing table has it
    web = start_web(tmp_path / "web.log", **env)
    # One call through the gateway starts its once-a-second flush of shared state to Redis, which the
    # freeze then fails every second (a capability with no server: refused, but routed far enough).
    httpx.post(
        web.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "chat.none@1", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )
    operator = {"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"}
    queue = redis.Redis.from_url(own_redis.url)

    def queued() -> list[bytes]:
        return list(queue.lrange("celery", 0, -1))

    try:
        pid = own_redis.pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            # Within 2 s (httpx gives up after that): the bound is 1 s, and the answer is the usual one.
            answered = httpx.post(web.url + "/api/v1/backups", headers=operator, timeout=2)
            assert answered.status_code == 202, (answered.status_code, answered.text)
            backup_id = answered.json()["id"]
            assert answered.json()["state"] == "queued"
            # A second operator write while it is still frozen: bounded as well, and no second outage line.
            again = httpx.get(web.url + f"/api/v1/backups/{backup_id}", headers=operator, timeout=2)
            assert again.status_code == 200
            # The flush meets the frozen Redis (once a second) and says so, once.
            assert wait_until(lambda: "load-balancer state continues" in web.process.log(), 10)
            assert httpx.post(web.url + "/api/v1/backups", headers=operator, timeout=2).status_code == 409
        finally:
            os.kill(pid, signal.SIGCONT)

        # The watchdog re-sends it once Redis answers. (The publish that gave up may still land: its bytes
        # were in the socket when the freeze began, and Redis reads them when it thaws. A task sent twice
        # runs once, every task claims its row first: modelforge/dispatch.py.)
        watched = run_command(
            [PYTHON, "manage.py", "shell", "-c", WATCH_LATER.format(seconds=settings.WORK_RESEND_AFTER + 5)],
            process_env(MODELFORGE_DATABASE_URL=database_url(), **env),
            timeout=120,
        )
        assert watched.returncode == 0, watched.stderr[-3000:]
        assert "'resent': 1" in watched.stdout, watched.stdout
        assert [m for m in queued() if str(backup_id).encode() in m], queued()

        # Once more with Redis answering (the first backup settled): the web process says the broker is
        # back, once; and it said it was away once, however many sends it gave up on.
        Backup.objects.filter(pk=backup_id).update(state="failed")
        answered = httpx.post(web.url + "/api/v1/backups", headers=operator, timeout=10)
        assert answered.status_code == 202, answered.text
        log = web.process.log()
        assert log.count("the broker did not answer") == 1, log[-3000:]
        assert log.count("the broker answers again") == 1, log[-3000:]
        assert "never retrieved" not in log, log[-3000:]
        # The gateway's flush, likewise: once when Redis went away, once when it came back.
        assert log.count("load-balancer state continues per process") == 1, log[-3000:]
        assert wait_until(lambda: "load-balancer state is shared again" in web.process.log(), 10)
    finally:
        web.process.stop()
