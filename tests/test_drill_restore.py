"""The recovery drill through real processes (bench/recovery/scenario.py): a restore under gateway
traffic, and a control-plane outage longer than the offline limit, each with three real agents running
five real engines. The fleet must not notice: no server process stopped, no node taken offline, no
server failed in the books, the server placed after the backup recorded again, no 5xx from the operator
API afterwards, and the capability serving every request again within seconds."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings

from bench.recovery.scenario import create_database, drop_databases, run_scenario
from tests.fixtures import database_url

pytestmark = pytest.mark.stack

# The drill's own Redis database: its broker queue must not be shared with the session's Celery worker
# (that worker would run the drill's tasks against the test database).
DRILL_REDIS_DB = 12
SERVING_AGAIN_WITHIN_S = 15


@pytest.fixture
def drill_database() -> Iterator[str]:
    """A database of the drill's own on the test server: the restore renames it and keeps the replaced
    one beside it, so it cannot be the test database. Dropped afterwards with that family."""
    url = create_database(database_url("postgres"), f"mf_drill_{os.getpid()}")
    yield url
    drop_databases(url)


def drill(variant: str, workdir: Path, url: str) -> dict[str, Any]:
    parts = urlsplit(str(settings.REDIS_URL))
    redis_url = urlunsplit((parts.scheme, parts.netloc, f"/{DRILL_REDIS_DB}", parts.query, ""))
    figures = run_scenario(workdir, database_url=url, redis_url=redis_url, variant=variant, say=print)
    print(json.dumps(figures, indent=1, default=str))
    return figures


def assert_the_fleet_did_not_notice(figures: dict[str, Any]) -> None:
    why = json.dumps(figures, default=str)
    assert figures["servers_running_before"] == 5, why
    assert figures["servers_stopped"] == 0, why
    assert figures["nodes_offline"] == 0, why
    assert figures["mass_loss_alerts"] == 0, why
    assert figures["servers_failed"] == 0, why
    assert figures["late_server_recorded"], why
    assert figures["api_5xx_after_switch"] == 0, why
    assert figures["failed_after_switch_5s"] == 0, why
    assert figures["recovery_s"] <= SERVING_AGAIN_WITHIN_S, why
    # The same detector still takes a really silent node offline: the zeros above are not for want of one.
    assert figures["control_offline_s"] is not None, why


def test_a_restore_under_traffic_stops_no_server_and_takes_no_node_offline(drill_database, tmp_path):
    figures = drill("restore", tmp_path / "restore", drill_database)
    assert_the_fleet_did_not_notice(figures)
    # Only a request under way during the switch-over may fail. The switch-over is a window, not an
    # instant (sessions on the service database are terminated, then both renames commit together), so a
    # request is counted as under way if it overlaps that window (the restore's switch_over phase).
    assert figures["requests_failed"] <= figures["in_flight_during_switch"], json.dumps(figures, default=str)
    assert figures["requests_total"] > 300


def test_a_control_plane_outage_longer_than_the_offline_limit_takes_no_node_offline(drill_database, tmp_path):
    figures = drill("outage", tmp_path / "outage", drill_database)
    assert_the_fleet_did_not_notice(figures)
    # With no web process every request is refused at the socket; none may fail once it answers again.
    assert figures["requests_failed"] == figures["failed_during_switch"], json.dumps(figures, default=str)
