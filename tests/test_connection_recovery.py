"""Connections recover by themselves: after every session of the service database is terminated (what a
restore's switch-over or a database restart does to pooled connections), the web process answers the
operator API, the dashboard's health and the agents' heartbeats without a single 500."""

from __future__ import annotations

import json

import httpx
import pytest
from django.conf import settings
from django.db import connection

from apps.nodes.tests.factories import heartbeat_report, make_node
from tests.fixtures import admin_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


def terminate_every_session() -> int:
    """Every session of the test database but this test's own (its teardown still needs it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (own,) = cursor.fetchone()
    with admin_connection() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND pid <> %s",
            [connection.settings_dict["NAME"], own],
        ).fetchall()
    return len(rows)


def test_pooled_connections_killed_under_the_web_process_cost_no_request(live_web):
    _, credential = make_node(name="pool-node", accelerator="cpu")
    operator = {"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"}
    agent = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    body = json.dumps(heartbeat_report(gpus=0))
    with httpx.Client(base_url=live_web.url, timeout=10) as client:

        def one_round() -> list[int]:
            return [
                client.get("/api/v1/nodes", headers=operator).status_code,
                client.post("/api/v1/agent/heartbeat", content=body, headers=agent).status_code,
                client.get("/readyz").status_code,
            ]

        # Warm both pools (Django's and the heartbeat endpoint's) with several connections each.
        assert one_round() == [200, 200, 200]
        assert terminate_every_session() >= 2
        answers = [status for _ in range(20) for status in one_round()]
        assert answers == [200, 200, 200] * 20
        assert terminate_every_session() >= 2
        assert one_round() == [200, 200, 200]
