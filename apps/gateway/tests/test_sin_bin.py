"""The sin-bin over real HTTP: a backend killed mid-test is benched, traffic moves to the other with no
client-visible error, the backend returns after its bench time, and repeated benching raises
lb_sin_bin_churn. (The test web process benches for 2 s x n instead of the default 30 s x n.)"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
from django.conf import settings

from apps.alerts.models import Alert
from apps.clusters.tests.factories import (
    bind,
    cluster_with,
    credential,
    echo_backend,
    loopback_node,
    running_server,
)
from apps.gateway.lbstate import BENCH_KEY
from tests.fixtures import PYTHON, http_ok, start_process, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

BURST = 12  # concurrent requests right after the kill: flaky gets about half, 5 failures in a row


def test_a_killed_backend_is_benched_returns_and_repeated_benching_raises_churn(live_web, tmp_path):
    (a_proc, a_port), (b_proc, b_port) = echo_backend(tmp_path, "steady"), echo_backend(tmp_path, "flaky")
    node = loopback_node()
    steady, flaky = running_server(node, "steady", a_port), running_server(node, "flaky", b_port)
    bind("rag.embedding@1", cluster=cluster_with("pool", [(steady, 1), (flaky, 1)]))
    key = credential(["rag.embedding@1"])
    store = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    store.delete(BENCH_KEY)

    def send() -> httpx.Response:
        return httpx.post(
            live_web.url + "/v1/embeddings",
            json={"model": "rag.embedding@1", "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )

    def backends_seen(count: int) -> Counter[str]:
        seen: Counter[str] = Counter()
        for _ in range(count):
            response = send()
            assert response.status_code == 200, response.text  # never a client-visible error
            seen[response.headers["x-modelforge-backend"]] += 1
        return seen

    assert wait_until(lambda: send().status_code == 200, 15)
    flaky_proc = b_proc
    try:
        for round_ in range(1, 4):
            assert wait_until(lambda: backends_seen(4)["pool/flaky"] > 0, 20), (
                f"flaky never served (round {round_})"
            )
            os.killpg(flaky_proc.process.pid, signal.SIGTERM)
            flaky_proc.process.wait(10)
            # Its connections are refused: each such request is retried on steady, and after 5 in a row
            # flaky is benched, shared through Redis. The round-robin sends every second request to
            # flaky, so the 5 failures come from a burst of concurrent requests: one at a time they took
            # about half a second on a slow machine, and the active probe (two failed probes 0.5 s apart)
            # could take flaky out first, leaving it never benched (CI, 2026-12-02).
            with ThreadPoolExecutor(BURST) as pool:
                burst = list(pool.map(lambda _: backends_seen(1), range(BURST)))
            assert sum(burst, Counter()) == {"pool/steady": BURST}
            bench = json.loads(store.hget(BENCH_KEY, str(flaky.pk)) or "null")
            assert bench is not None and bench["count"] == round_
            assert backends_seen(20) == {"pool/steady": 20}
            assert bench["until"] - bench["since"] == pytest.approx(2 * round_, abs=0.1)
            assert "consecutive failures" in bench["reason"]
            # It comes back on the same port and returns to the rotation once its bench time is over.
            flaky_proc = start_process(
                [PYTHON, "-m", "agent.engines.echo", "--port", str(b_port), "--model", "flaky"],
                {},
                tmp_path / f"flaky-{round_}.log",
            )
            assert wait_until(lambda: http_ok(f"http://127.0.0.1:{b_port}/health"), 20)
        assert wait_until(lambda: backends_seen(4)["pool/flaky"] > 0, 20)
        churn = Alert.objects.open().get(code="lb_sin_bin_churn")
        assert churn.subject_name == "pool/flaky" and churn.severity == "warning"
    finally:
        for proc in (a_proc, flaky_proc):
            if proc.process.poll() is None:
                os.killpg(proc.process.pid, signal.SIGTERM)
                proc.process.wait(10)
