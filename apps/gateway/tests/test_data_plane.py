"""Serving follows the data plane (issue 48, section 4): a backend whose node's agent went silent (stale, then
offline) but whose engine answers the gateway's probes keeps serving; the node and its server show that
management is lost; an engine that stops answering is dropped by the probes, as on any node; and
CAPABILITY_UNSERVED is not raised for a capability whose backends answer. Real gunicorn gateway, real echo
engines, real PostgreSQL and Redis; the node's silence is made the way the liveness tests make it (its
last heartbeat moved back, the real sweep run)."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from datetime import timedelta

import httpx
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from apps.alerts.models import Alert
from apps.clusters.bindings import read_bindings
from apps.clusters.health import check_capabilities
from apps.clusters.tests.factories import bind, credential, echo_backend, loopback_node, running_server
from apps.gateway.probe import PROBES_KEY
from apps.gateway.tests.test_probe import Result, probe_state, steady_load
from apps.nodes import listening
from apps.nodes.liveness import sweep
from apps.nodes.models import ListeningClock, Node
from apps.servers.models import ModelServer
from tests.fixtures import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def engine(tmp_path):
    """A real echo engine; resumed and stopped at the end."""
    started, port = echo_backend(tmp_path, "lost")
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(PROBES_KEY)
    yield started, port
    if started.process.poll() is None:
        os.killpg(started.process.pid, signal.SIGCONT)
        os.killpg(started.process.pid, signal.SIGTERM)
        started.process.wait(10)


def silent_for(node: Node, seconds: float) -> None:
    """The node's agent last reported ``seconds`` ago while the control plane listened all along; the real
    sweep then moves it (stale past NODE_STALE_AFTER, offline past NODE_OFFLINE_AFTER)."""
    now = timezone.now()
    listening.current()
    ListeningClock.objects.update(listening_since=now - timedelta(hours=1), web_seen_at=now, swept_at=now)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=seconds))
    sweep()


def liveness_now(node: Node) -> str:
    return Node.objects.with_liveness().get(pk=node.pk).liveness_now


def test_a_backend_on_a_stale_then_offline_node_keeps_serving_while_its_engine_answers(live_web, engine):
    _, port = engine
    node = loopback_node()
    server = running_server(node, "lost", port)
    bind("rag.embedding@1", server=server)
    key = credential(["rag.embedding@1"])

    def ok() -> bool:
        return (
            httpx.post(
                live_web.url + "/v1/embeddings",
                json={"model": "rag.embedding@1", "input": "x"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=5,
            ).status_code
            == 200
        )

    assert wait_until(ok, 15)
    stop, results = threading.Event(), list[Result]()
    workers = steady_load(live_web.url, key, stop, results, threads=3)
    try:
        assert wait_until(lambda: len(results) > 20, 10)
        silent_for(node, settings.NODE_STALE_AFTER + 5)
        assert liveness_now(node) == "stale"
        stale_at = len(results)
        # The gateway's table is rebuilt at least every REBUILD_AT_LEAST_EVERY_S: past it, still served.
        assert wait_until(lambda: len(results) > stale_at + 200, 30)
        silent_for(node, settings.NODE_OFFLINE_AFTER + 5)
        assert liveness_now(node) == "offline"
        offline_at = len(results)
        assert wait_until(lambda: len(results) > offline_at + 200, 30)
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
    # The books show that management is lost, with the alerts as before.
    server.refresh_from_db()
    assert (server.state, server.failure_code) == ("failed", "NODE_OFFLINE")
    assert Alert.objects.open().filter(code="node_offline", subject_id=str(node.pk)).exists()
    failed = Counter((r.status, r.code) for r in results if r.status != 200)
    assert failed == Counter(), failed
    assert {r.backend for r in results} == {"lost"}


def test_an_engine_that_stops_answering_on_an_offline_node_is_dropped(live_web, engine):
    process, port = engine
    node = loopback_node()
    server = running_server(node, "lost", port)
    bind("rag.embedding@1", server=server)
    key = credential(["rag.embedding@1"])

    def call() -> httpx.Response:
        return httpx.post(
            live_web.url + "/v1/embeddings",
            json={"model": "rag.embedding@1", "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )

    assert wait_until(lambda: call().status_code == 200, 15)
    silent_for(node, settings.NODE_OFFLINE_AFTER + 5)
    assert liveness_now(node) == "offline"
    os.kill(process.process.pid, signal.SIGSTOP)
    assert wait_until(lambda: probe_state(str(server.pk)) == "down", 15, interval=0.1)
    refused = call()
    assert refused.status_code == 503 and refused.json()["code"] == "NO_HEALTHY_BACKEND", refused.text


def test_a_capability_whose_backend_answers_on_a_stale_node_is_not_unserved(engine):
    _, port = engine
    node = loopback_node()
    server = running_server(node, "lost", port)
    bind("rag.embedding@1", server=server)
    silent_for(node, settings.NODE_STALE_AFTER + 5)
    assert liveness_now(node) == "stale"
    assert check_capabilities() == []
    assert not Alert.objects.open().filter(code="CAPABILITY_UNSERVED").exists()
    # Offline: the server is failed NODE_OFFLINE in the books, its process unknown, still routed.
    silent_for(node, settings.NODE_OFFLINE_AFTER + 5)
    assert check_capabilities() == []


def test_a_server_its_agent_reported_failed_is_not_routed_whatever_its_node(engine):
    """Only node liveness stops being a routing criterion: a process the agent said is gone stays out."""
    _, port = engine
    node = loopback_node()
    server = running_server(node, "lost", port)
    bind("rag.embedding@1", server=server)
    ModelServer.objects.filter(pk=server.pk).update(state="failed", failure_code="PROCESS_LOST")
    silent_for(node, settings.NODE_OFFLINE_AFTER + 5)
    bindings, _ = read_bindings()
    assert [b.backends for b in bindings["rag.embedding@1"]] == [()]
    assert check_capabilities() == ["rag.embedding@1"]
    # And a server failed NODE_OFFLINE whose node reports again is not routed until reconcile adopts it (its
    # port may have been given to another server meanwhile).
    ModelServer.objects.filter(pk=server.pk).update(failure_code="NODE_OFFLINE")
    bindings, _ = read_bindings()
    assert [len(b.backends) for b in bindings["rag.embedding@1"]] == [1]
    Node.objects.filter(pk=node.pk).update(liveness="online", last_heartbeat_at=timezone.now())
    bindings, _ = read_bindings()
    assert [b.backends for b in bindings["rag.embedding@1"]] == [()]
