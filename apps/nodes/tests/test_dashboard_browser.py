"""The nodes pages in a real browser: list, detail with GPU memory bars, enrollment token minting."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.nodes.tests.factories import GIB, beat, gpu_report, heartbeat_report, make_node
from tests.fixtures import ARTIFACTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.stack, pytest.mark.django_db(transaction=True)]


def test_an_operator_sees_gpu_memory_split_and_mints_a_token(live_web, browser):
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    node, credential = make_node(name="gpu-rig-1")
    report = heartbeat_report()
    report["gpus"] = [
        gpu_report(0, total=24 * GIB, used=18 * GIB, managed=12 * GIB),
        gpu_report(1, total=24 * GIB, used=3 * GIB, managed=0),
    ]
    beat(credential, report)
    page = browser.new_page()
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        page.click("nav.sidebar >> text=Nodes")
        page.wait_for_selector("table.table")
        assert page.locator("tr:has-text('gpu-rig-1') .badge").first.inner_text() == "online"

        page.click("text=gpu-rig-1")
        page.wait_for_selector(".gpu")
        bars = page.locator(".gpu .bar")
        assert bars.count() == 2
        label = bars.first.get_attribute("aria-label") or ""
        assert "12 GiB ModelForge" in label and "6 GiB external" in label and "6 GiB free" in label
        widths = (
            page.locator(".gpu")
            .first.locator(".seg")
            .evaluate_all("segs => segs.map(s => s.getBoundingClientRect().width)")
        )
        # managed : external : free = 12 : 6 : 6 GiB
        assert widths[0] == pytest.approx(2 * widths[1], rel=0.05)
        assert widths[1] == pytest.approx(widths[2], rel=0.05)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "node-detail.png"), full_page=True)

        page.click("button:has-text('Disable')")
        page.wait_for_selector("text=disabled")
        assert "nothing is assigned here" in page.locator(".card:has-text('Assignment')").inner_text()

        page.goto(live_web.url + "/nodes/enrollment-tokens/")
        page.fill("input[name=note]", "rack 4")
        page.click("button:has-text('Mint a token')")
        token = page.locator("#minted-token").inner_text()
        assert token.startswith("mfe_")
        page.reload()
        assert page.locator("#minted-token").count() == 0  # shown once
    finally:
        page.close()
    node.refresh_from_db()
    assert node.enabled is False
