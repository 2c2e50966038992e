"""A server's engine signals where people look: its dashboard page, the servers API and the admin, read from
Redis as the heartbeat left them; "not reported" when the engine says nothing, never an error."""

from __future__ import annotations

import re
import time

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User

from apps.nodes.engine_signals import ENGINE_SIGNALS_KEY, EngineSignals, write_engine_signals
from apps.servers.models import ModelServer
from apps.servers.scheduler import Request, place
from apps.servers.tests.factories import cpu_node
from tests.fixtures import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def store():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(ENGINE_SIGNALS_KEY)
    yield client
    client.delete(ENGINE_SIGNALS_KEY)


@pytest.fixture
def server() -> ModelServer:
    cpu_node("cpu-a", available_gib=8)
    return place(Request(name="echo", profile="test-echo", model="m"))


def report(store, server: ModelServer, *, node: str | None = None, age_s: float = 1, kv: float | None = 0.25):
    signals = EngineSignals(3, 1, kv, time.time() - age_s, node or str(server.node_id))
    write_engine_signals(store, {str(server.pk): signals})


def test_the_page_shows_running_waiting_and_kv_use(client, store, server):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    report(store, server)
    body = client.get(f"/servers/{server.pk}/").content.decode()
    assert "3 running, 1 waiting" in body
    assert "KV cache: 25 % used" in body
    # Reported 1 s before the page was asked for: a second or two more on a loaded machine.
    assert re.search(r"Reported [1-4] s ago with the node", body), body


def test_the_page_says_not_reported_when_the_engine_says_nothing(client, store, server):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    body = client.get(f"/servers/{server.pk}/").content.decode()
    assert "Not reported: the engine publishes no load metrics" in body
    report(store, server, kv=None, age_s=600 - 30)  # 9.5 min: stale, not yet forgotten (10 min)
    body = client.get(f"/servers/{server.pk}/").content.decode()
    assert "KV cache: not reported by the engine" in body
    assert "Stale: last reported 9 min" in body


def test_the_api_gives_the_engine_signals_with_their_state(operator_client, store, server):
    assert operator_client.get(f"/api/v1/servers/{server.pk}").json()["engine"] == {
        "state": "not_reported",
        "running": None,
        "waiting": None,
        "kv_cache_used": None,
        "reported_at": None,
    }
    report(store, server)
    engine = operator_client.get(f"/api/v1/servers/{server.pk}").json()["engine"]
    assert {k: engine[k] for k in ("state", "running", "waiting", "kv_cache_used")} == {
        "state": "reported",
        "running": 3,
        "waiting": 1,
        "kv_cache_used": 0.25,
    }
    assert abs(engine["reported_at"] - (time.time() - 1)) < 5


def test_signals_from_a_node_the_server_does_not_run_on_are_not_shown(operator_client, store, server):
    report(store, server, node="another-node")
    assert operator_client.get(f"/api/v1/servers/{server.pk}").json()["engine"]["state"] == "not_reported"


def test_redis_away_is_unknown_not_an_error(operator_client, server, settings):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    response = operator_client.get(f"/api/v1/servers/{server.pk}")
    assert response.status_code == 200
    assert response.json()["engine"]["state"] == "unknown"


def test_the_admin_shows_the_engine_load(client, store, server):
    client.force_login(User.objects.create_superuser("root-ops", email="", password="x-long-password-1"))
    report(store, server)
    page = client.get(f"/admin/servers/modelserver/{server.pk}/change/")
    assert page.status_code == 200
    assert "3 running, 1 waiting, KV cache 25 % used" in page.content.decode()
