"""In Chromium: the Telemetry history page draws its charts, and the API browser renders Swagger UI from
our own static files, with no request leaving 127.0.0.1 (no CDN)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.db import connections

from apps.nodes.tests.factories import beat, heartbeat_report, make_node
from apps.observability import sampling
from tests.fixtures import ARTIFACTS, log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.stack,
    pytest.mark.django_db(databases=["default", "observability"], transaction=True),
]


@pytest.fixture(autouse=True)
def _close_monitoring() -> Iterator[None]:
    yield
    connections["observability"].close()


def test_an_operator_sees_charts_and_browses_the_api_offline(live_web, browser):
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    node, credential = make_node(name="gpu-chart-1")
    beat(credential, heartbeat_report(gpus=1))
    sampling.sample()
    beat(credential, heartbeat_report(gpus=1))
    sampling.sample()

    page = browser.new_page()
    hosts: set[str] = set()
    page.on("request", lambda request: hosts.add(urlsplit(request.url).hostname or request.url))
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        page.goto(f"{live_web.url}/observability/nodes/{node.pk}/")
        for chart_id in ("host-memory", "host-load", "gpu-0-memory", "gpu-0-utilization"):
            box = page.locator(f"#{chart_id} svg").bounding_box()
            assert box is not None and box["width"] > 200 and box["height"] > 40, chart_id
        assert page.locator("#gpu-0-memory polygon.series").count() == 3
        assert page.locator("#host-load polyline.series").count() >= 1
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "node-telemetry-charts.png"), full_page=True)

        page.click("header >> text=API docs")
        page.wait_for_selector(".swagger-ui .information-container", timeout=15000)
        page.wait_for_selector(".opblock", timeout=15000)  # the schema was fetched and drawn
        paths = page.locator(".opblock-summary-path").all_inner_texts()
        assert any("/api/v1/nodes" in p.replace("\u200b", "") for p in paths), paths[:5]
        page.screenshot(path=str(ARTIFACTS / "api-docs.png"))
    finally:
        page.close()
    assert hosts == {"127.0.0.1"}, hosts
