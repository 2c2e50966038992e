"""The dashboard shell in a real browser: Debian's chromium driven by Playwright."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tests.fixtures import ARTIFACTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.stack]


@pytest.mark.django_db(transaction=True)
def test_an_operator_logs_in_and_sees_the_overview(live_web, browser):
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(live_web.url + "/")
        assert "/login/" in page.url
        page.fill("#id_username", "ops")
        page.fill("#id_password", "wrong-password")
        page.click("button[type=submit]")
        assert page.locator("[role=alert]").is_visible()

        page.fill("#id_username", "ops")
        page.fill("#id_password", "correct-horse-battery-9")
        page.click("button[type=submit]")
        page.wait_for_selector("h1:has-text('Overview')")
        assert page.locator("#database .state").inner_text() == "reachable"
        assert page.locator("#broker .state").inner_text() == "reachable"
        assert page.locator("nav.sidebar").inner_text().count("\n") >= 7
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)
    finally:
        page.close()


@pytest.mark.django_db(transaction=True)
def test_a_non_staff_account_is_told_it_is_not_an_operator(live_web, browser):
    User.objects.create_user("viewer", password="correct-horse-battery-9", is_staff=False)
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.goto(live_web.url + "/login/")
        page.fill("#id_username", "viewer")
        page.fill("#id_password", "correct-horse-battery-9")
        page.click("button[type=submit]")
        assert "not an operator" in page.locator("[role=alert]").inner_text()
    finally:
        page.close()


@pytest.mark.django_db(transaction=True)
def test_an_operator_builds_a_cluster_and_binds_a_capability_in_the_browser(live_web, browser):
    from apps.clusters.models import Capability, Cluster, RoutingTier

    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        page.wait_for_selector("h1:has-text('Overview')")
        page.goto(live_web.url + "/clusters/")
        page.fill("#create-capability input[name=name]", "RAG.embedding@1")  # refused: not written exactly
        page.click("#create-capability button")
        assert "VALIDATION_ERROR" in page.locator("body").inner_text()
        page.fill("#create-capability input[name=name]", "rag.embedding@1")
        page.click("#create-capability button")
        page.fill("#create-cluster input[name=name]", "embed")
        page.select_option("#create-cluster select[name=algorithm]", "least_connections")
        page.click("#create-cluster button")
        page.wait_for_selector("h1:has-text('embed')")
        page.fill("#add-member input[name=name]", "a")
        page.click("#add-member button")
        assert page.locator("#members td:has-text('a')").first.is_visible()
        page.goto(live_web.url + "/clusters/")
        page.select_option("#create-tier select[name=cluster]", label="embed")
        page.click("#create-tier button")
        assert "tier 0: cluster embed" in page.locator("body").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-clusters.png"), full_page=True)
    finally:
        page.close()
    assert list(Capability.objects.values_list("name", flat=True)) == ["rag.embedding@1"]
    cluster = Cluster.objects.get(name="embed")
    assert cluster.algorithm == "least_connections" and cluster.members.count() == 1
    assert RoutingTier.objects.get().cluster == cluster


@pytest.mark.django_db(transaction=True)
def test_a_fleet_held_stale_reads_stale_on_the_nodes_pages_in_the_browser(live_web, browser):
    """Three of four nodes silent at once: the sweep holds them as the fleet's stale state (no node row
    written, apps/nodes/liveness.py); the operator sees each stale, filters by it and opens one."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.nodes.liveness import sweep
    from apps.nodes.models import Node
    from apps.nodes.tests.factories import beat, make_node

    for i in range(4):
        _, credential = make_node(name=f"rack-{i}")
        beat(credential)
    Node.objects.exclude(name="rack-3").update(last_heartbeat_at=timezone.now() - timedelta(minutes=10))
    moved = sweep()
    assert sorted(name for _, name in moved.stale) == ["rack-0", "rack-1", "rack-2"]
    assert Node.objects.filter(liveness="online").count() == 4  # the columns were not written

    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        page.wait_for_selector("h1:has-text('Overview')")
        page.goto(live_web.url + "/nodes/")
        assert page.locator(".badge-stale:has-text('stale')").count() == 3
        assert "NODE_MASS_LOSS" in page.locator("body").inner_text()  # the hold's callout
        page.select_option("select[name=liveness]", "stale")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**liveness=stale**")
        rows = page.locator("tbody tr")
        assert rows.count() == 3 and "rack-3" not in page.locator("tbody").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "nodes-fleet-stale.png"), full_page=True)
        page.click("a:has-text('rack-1')")
        page.wait_for_selector("h1:has-text('rack-1')")
        assert page.locator("h1 .badge-stale").inner_text() == "stale"
        assert "went stale at once" in page.locator("body").inner_text()  # the fleet's alert covers it
    finally:
        page.close()


@pytest.mark.django_db(transaction=True)
def test_a_filter_value_the_nodes_page_cannot_read_is_refused_in_the_browser(live_web, browser):
    """``?enabled=flase`` lists nothing and says why (modelforge/filters.py); the select then filters."""
    from apps.nodes.tests.factories import beat, make_node

    _, credential = make_node(name="on-a")
    make_node(name="off-b", enabled=False)
    beat(credential)
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        page.goto(live_web.url + "/nodes/?enabled=flase")
        callout = page.locator("#filter-errors")
        assert callout.is_visible() and "enabled" in callout.inner_text()
        assert "on-a" not in page.locator("tbody").inner_text()
        assert page.locator("select[name=enabled]").input_value() == ""  # shown as "any", not as a guess
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "nodes-filter-refused.png"), full_page=True)
        page.select_option("select[name=enabled]", "false")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**enabled=false**")
        assert page.locator("#filter-errors").count() == 0
        assert (
            "off-b" in page.locator("tbody").inner_text() and "on-a" not in page.locator("tbody").inner_text()
        )
        assert page.locator("select[name=enabled]").input_value() == "false"
    finally:
        page.close()
