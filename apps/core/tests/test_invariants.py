"""The platform invariants on the live database: sound on a fresh installation, a broken one named in
the API, the command and the overview; answered from authoritative tables even with the monitoring
store gone."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connections

from apps.core.registry import invariants as INVARIANTS
from apps.nodes.models import GPU
from apps.nodes.tests.factories import beat, heartbeat_report, make_node
from tests.fixtures import free_port

pytestmark = pytest.mark.django_db


def test_a_fresh_platform_is_sound(operator_client, capsys):
    body = operator_client.get("/api/v1/system/invariants").json()
    # Every invariant a restored copy is checked with, plus the live-only one: no work past its bound.
    assert body["sound"] is True and len(body["invariants"]) == len(INVARIANTS) + 1
    assert body["invariants"][-1]["name"] == "no_work_past_its_bound"
    assert {i["name"] for i in body["invariants"]} >= {"one_open_alert_per_key", "gpu_memory_bounds"}
    call_command("check_invariants")
    assert "sound: every invariant holds" in capsys.readouterr().out


def test_a_broken_invariant_is_named_everywhere(operator_client, client):
    _, credential = make_node(name="gpu-a")
    beat(credential, heartbeat_report(gpus=1))
    GPU.objects.update(memory_managed_bytes=10**15)  # more managed than the GPU has: impossible
    body = operator_client.get("/api/v1/system/invariants").json()
    broken = [i for i in body["invariants"] if i["violations"]]
    assert body["sound"] is False and [(i["name"], i["violations"]) for i in broken] == [
        ("gpu_memory_bounds", 1)
    ]
    with pytest.raises(CommandError, match="not sound"):
        call_command("check_invariants")
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/").content.decode()
    assert "not sound" in page and "gpu_memory_bounds" in page


def test_the_invariants_read_no_monitoring_table():
    assert all("observability" not in invariant.query for invariant in INVARIANTS)


@pytest.mark.django_db(databases=["default", "observability"], transaction=True)
def test_the_answer_stands_with_the_monitoring_store_gone(operator_client):
    connection = connections["observability"]
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    try:
        body = operator_client.get("/api/v1/system/invariants").json()
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert body["sound"] is True
