"""Telemetry history as charts: server-rendered SVG (no script, no CDN), and the host readings (RAM,
load) that give a CPU node a history at all."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connections

from apps.nodes.tests.factories import GIB, beat, heartbeat_report, make_node
from apps.observability import sampling
from apps.observability.charts import Series, chart, gib, percent
from apps.observability.models import HostSample

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TIMES = [T0 + timedelta(minutes=i) for i in range(3)]


def test_a_line_chart_has_a_polyline_per_series_and_labelled_axes():
    svg = str(
        chart(
            "util", "Utilization", TIMES, [Series("GPU", "#00f", [0, 50, 100])], y_format=percent, y_max=100
        )
    )
    assert svg.count("<polyline") == 1 and 'data-series="GPU"' in svg
    assert ">0 %<" in svg and ">50 %<" in svg and ">100 %<" in svg
    assert svg.count('class="x-label"') == 3 and 'id="util"' in svg and 'aria-label="Utilization"' in svg
    # 0 % sits on the x axis (y = 158), 100 % at the top (y = 10); x runs from the left margin to the right.
    assert 'points="64.0,158.0 346.0,84.0 628.0,10.0"' in svg


def test_a_missing_reading_breaks_the_line():
    svg = str(chart("load", "Load", TIMES, [Series("Load", "#000", [1.0, None, 2.0])]))
    assert svg.count("<polyline") == 2


def test_stacked_areas_add_up_to_the_total():
    series = [Series("Managed", "#00f", [2 * GIB] * 3), Series("External", "#f80", [GIB] * 3)]
    svg = str(chart("mem", "Memory", TIMES, series, y_format=gib, y_max=4 * GIB, stacked=True))
    assert svg.count("<polygon") == 2 and ">4.0 GiB<" in svg and ">2.0 GiB<" in svg
    # External's top edge is at 3 GiB of 4: a quarter of the plot height (148) below the top (10).
    assert "64.0,47.0 346.0,47.0 628.0,47.0" in svg


def test_names_are_escaped_and_nothing_is_drawn_without_samples():
    svg = str(chart("x", "<b>t</b>", TIMES, [Series("<script>", "#000", [1, 2, 3])]))
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "<b>" not in svg
    assert str(chart("x", "empty", [], [Series("a", "#000", [])])) == ""


@pytest.fixture
def _close_monitoring() -> Iterator[None]:
    yield
    connections["observability"].close()


@pytest.mark.django_db(databases=["default", "observability"])
@pytest.mark.usefixtures("_close_monitoring")
def test_a_cpu_node_gets_a_ram_and_load_history_and_charts(client):
    node, credential = make_node(name="cpu-a")
    report = heartbeat_report(gpus=0)
    report["cpu"] = {"count": 8, "load_1m": 3.5}
    report["memory"] = {"total_bytes": 32 * GIB, "available_bytes": 12 * GIB}
    assert beat(credential, report) is not None
    assert sampling.sample()["hosts"] >= 1
    row = HostSample.objects.get(node_id=node.pk)
    assert (row.memory_total_bytes, row.memory_available_bytes) == (32 * GIB, 12 * GIB)
    assert (row.load_1m, row.cpu_count, row.node_name) == (3.5, 8, "cpu-a")

    client.force_login(User.objects.create_user("ops", is_staff=True))
    assert "RAM and load history" in client.get(f"/nodes/{node.pk}/").content.decode()
    page = client.get(f"/observability/nodes/{node.pk}/").content.decode()
    assert 'id="host-history"' in page and 'id="host-memory"' in page and 'id="host-load"' in page
    assert "8 CPUs" in page and ">32 GiB<" in page and "No samples" not in page


@pytest.mark.django_db(databases=["default", "observability"])
@pytest.mark.usefixtures("_close_monitoring")
def test_a_gpu_nodes_page_charts_memory_split_and_utilization(client):
    node, credential = make_node(name="gpu-c")
    assert beat(credential, heartbeat_report(gpus=1)) is not None
    sampling.sample()
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get(f"/observability/nodes/{node.pk}/").content.decode()
    assert 'id="gpu-0-memory"' in page and 'id="gpu-0-utilization"' in page
    for name in ("ModelForge-managed", "External", "Free"):
        assert f'data-series="{name}"' in page
