"""Monitoring history behind its own database alias: samples copied from the nodes' current readings,
and a monitoring store that fails alone: OBSERVABILITY_DEGRADED, named in the API and the dashboard,
while heartbeats and placement go on from authoritative state."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from apps.alerts.models import Alert
from apps.nodes.models import GPU, Node
from apps.nodes.tests.factories import beat, heartbeat_report, make_node
from apps.observability import sampling
from apps.observability.models import TelemetrySample
from tests.fixtures import clear_usage, free_port

pytestmark = pytest.mark.django_db(databases=["default", "observability"])


@pytest.fixture(autouse=True)
def close_the_monitoring_connection() -> Iterator[None]:
    """The alias is a second connection to the test database: closed after each test, or dropping
    the test database at the end would find it still in use."""
    yield
    connections["observability"].close()


@pytest.fixture(autouse=True)
def no_gateway_traffic_counted(settings) -> None:
    """The sampler copies the load balancer's per-minute traffic from the shared test Redis: counters left
    there by the gateway's tests (kept an hour) would be sampled too, so each test starts without them."""
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=1, socket_timeout=1)
    for pattern in ("modelforge:lb:traffic:*", "modelforge:lb:errors:*", "modelforge:lb:busy:*"):
        keys = list(client.scan_iter(pattern, count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
def reporting_node() -> tuple[Node, str]:
    node, credential = make_node(name="gpu-a")
    assert beat(credential, heartbeat_report(gpus=2)) is not None
    node.refresh_from_db()
    assert node.liveness == "online"
    return node, credential


@pytest.fixture(autouse=True)
def no_usage_counted() -> None:
    """Usage counted by earlier tests' gateway calls is not these tests' (tests/ share one Redis)."""
    clear_usage()


@pytest.fixture
def broken_observability() -> Iterator[None]:
    """The monitoring store's server gone: its alias points at a port nothing listens on."""
    connection = connections["observability"]
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    yield
    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(saved)


def test_samples_copy_every_gpus_current_reading_and_expire(reporting_node, settings):
    node, credential = reporting_node
    settings.TELEMETRY_RETENTION_DAYS = 7
    assert sampling.sample() == {
        "sampled": 2,
        "hosts": 1,
        "traffic": 0,
        "usage": 0,
        "expired": 0,
        "degraded": 0,
    }
    rows = list(TelemetrySample.objects.filter(node_id=node.pk).order_by("gpu_index"))
    current = {g.index: g for g in GPU.objects.filter(node=node)}
    assert [r.gpu_index for r in rows] == [0, 1] and rows[0].node_name == "gpu-a"
    assert rows[1].memory_used_bytes == current[1].memory_used_bytes
    assert rows[1].temperature_c == current[1].temperature_c
    with time_machine.travel(timezone.now() + timedelta(days=8)):
        beat(credential, heartbeat_report(gpus=2))
        assert sampling.sample() == {
            "sampled": 2,
            "hosts": 1,
            "traffic": 0,
            "usage": 0,
            "expired": 3,
            "degraded": 0,
        }


def test_a_node_that_stopped_reporting_is_not_sampled(reporting_node):
    with time_machine.travel(timezone.now() + timedelta(minutes=10)):
        assert sampling.sample()["sampled"] == 0


@pytest.mark.django_db(databases=["default", "observability"], transaction=True)
def test_the_monitoring_store_fails_alone(reporting_node, broken_observability, operator_client, client):
    node, credential = reporting_node
    assert sampling.sample() == {
        "sampled": 0,
        "hosts": 0,
        "traffic": 0,
        "usage": 0,
        "expired": 0,
        "degraded": 1,
    }
    alert = Alert.objects.open().get(code="OBSERVABILITY_DEGRADED")
    assert alert.severity == "warning" and "Serving, scheduling and recovery continue" in alert.message
    assert "OperationalError" in alert.message and "refused" in alert.message  # the dead port, nothing else

    # Heartbeats (and so liveness and admission) go on from the authoritative store.
    before = Node.objects.get(pk=node.pk).last_heartbeat_at
    assert beat(credential, heartbeat_report(gpus=2)) is not None
    after = Node.objects.get(pk=node.pk).last_heartbeat_at
    assert before is not None and after is not None and after > before
    assert operator_client.get(f"/api/v1/nodes/{node.pk}").status_code == 200

    refused = operator_client.get(f"/api/v1/nodes/{node.pk}/telemetry")
    assert refused.status_code == 503 and refused.json()["code"] == "OBSERVABILITY_DEGRADED"
    assert set(refused.json()) == {"code", "message", "correlation_id"}
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get(f"/observability/nodes/{node.pk}/")
    assert page.status_code == 200 and 'id="observability-degraded"' in page.content.decode()


@pytest.mark.django_db(databases=["default", "observability"], transaction=True)
def test_the_alert_clears_when_the_store_is_back(reporting_node, operator_client):
    connection = connections["observability"]
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    try:
        sampling.sample()
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert Alert.objects.open().filter(code="OBSERVABILITY_DEGRADED").exists()
    assert sampling.sample()["sampled"] == 2
    assert not Alert.objects.open().filter(code="OBSERVABILITY_DEGRADED").exists()
    node, _ = reporting_node
    history = operator_client.get(f"/api/v1/nodes/{node.pk}/telemetry?minutes=5").json()
    assert history["node_name"] == "gpu-a" and [s["gpu_index"] for s in history["samples"]] == [0, 1]
    # Host readings (RAM, load) come with it: the only history a CPU node has.
    assert len(history["host_samples"]) == 1
    assert (
        history["host_samples"][0]["memory_total_bytes"]
        > history["host_samples"][0]["memory_available_bytes"]
    )
    bad = operator_client.get(f"/api/v1/nodes/{node.pk}/telemetry?minutes=0")
    assert bad.status_code == 400 and bad.json()["code"] == "VALIDATION_ERROR"


def test_the_dashboard_shows_a_nodes_history(reporting_node, client):
    node, _ = reporting_node
    sampling.sample()
    client.force_login(User.objects.create_user("ops", is_staff=True))
    assert "Telemetry history" in client.get(f"/nodes/{node.pk}/").content.decode()
    page = client.get(f"/observability/nodes/{node.pk}/").content.decode()
    assert "GPU 0" in page and "GPU 1" in page and "observability-degraded" not in page


def test_only_the_monitoring_tables_live_behind_the_alias():
    from django.db import router

    assert router.db_for_write(TelemetrySample) == "observability"
    assert router.db_for_write(Node) == "default" and router.db_for_read(Alert) == "default"


@pytest.fixture
def counted_traffic(settings) -> Iterator[tuple[str, int]]:
    """The gateway's shared per-minute counters in the test Redis, for a backend of this test only."""
    import time
    import uuid

    import redis

    from apps.gateway.lbstate import ERRORS_KEY, TRAFFIC_BUCKET_S, TRAFFIC_KEY

    backend = str(uuid.uuid4())
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    current = int(time.time() // TRAFFIC_BUCKET_S)
    client.hincrby(TRAFFIC_KEY.format(bucket=current - 2), backend, 120)
    client.hincrby(TRAFFIC_KEY.format(bucket=current - 1), backend, 90)
    client.hincrby(ERRORS_KEY.format(bucket=current - 1), backend, 3)
    client.hincrby(TRAFFIC_KEY.format(bucket=current), backend, 7)  # this minute is not complete: not kept
    yield backend, current
    for bucket in range(current - 2, current + 1):
        client.hdel(TRAFFIC_KEY.format(bucket=bucket), backend)
        client.hdel(ERRORS_KEY.format(bucket=bucket), backend)


def test_the_gateways_per_minute_counters_are_kept_once_per_complete_minute(
    counted_traffic, operator_client, client
):
    from apps.gateway.lbstate import TRAFFIC_BUCKET_S
    from apps.observability.models import TrafficSample

    backend, current = counted_traffic
    sampling.sample()
    sampling.sample()  # the same minutes seen again: kept once
    rows = list(TrafficSample.objects.filter(backend=backend).order_by("minute"))
    assert [(r.requests, r.errors) for r in rows] == [(120, 0), (90, 3)]
    assert rows[-1].minute.timestamp() == (current - 1) * TRAFFIC_BUCKET_S

    listed = operator_client.get(f"/api/v1/traffic?backend={backend}&minutes=10").json()
    assert [(s["requests"], s["errors"]) for s in listed["samples"]] == [(90, 3), (120, 0)]
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/observability/traffic/").content.decode()
    assert 'id="traffic-totals"' in page and "210" in page and "(removed server)" in page


@pytest.mark.django_db(databases=["default", "observability"], transaction=True)
def test_traffic_history_names_a_failing_store(broken_observability, operator_client, client):
    refused = operator_client.get("/api/v1/traffic")
    assert refused.status_code == 503 and refused.json()["code"] == "OBSERVABILITY_DEGRADED"
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/observability/traffic/")
    assert page.status_code == 200 and 'id="observability-degraded"' in page.content.decode()
