"""The registries apps fill at start-up: every app's contribution present, in app order, names unique."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.core import registry
from apps.core.registry import Invariant, Registry


def test_each_app_contributes_its_invariants_in_app_order():
    assert [invariant.name for invariant in registry.invariants] == [
        "one_installation",
        "one_open_alert_per_key",
        "gpu_memory_bounds",
        "reservations_on_their_node",
        "credentials_hashed",
        "verified_backups_have_files",
    ]


def test_a_name_registered_twice_with_another_meaning_is_refused():
    invariants: Registry[Invariant] = Registry("invariant")
    first = Invariant("x", "one", "SELECT 0")
    invariants.register(first)
    invariants.register(first)  # the same contribution again: harmless
    with pytest.raises(ValueError, match="invariant 'x' is registered twice"):
        invariants.register(Invariant("x", "another", "SELECT 1"))
    assert len(invariants) == 1 and "x" in invariants


@pytest.mark.django_db
def test_the_overview_shows_every_registered_card(client):
    assert [card.name for card in sorted(registry.overview_cards, key=lambda c: c.position)] == [
        "fleet",
        "servers",
        "alerts",
    ]
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/").content.decode()
    for heading in (
        "<h2>Fleet</h2>",
        "<h2>Model servers</h2>",
        "<h2>Open alerts</h2>",
        "Platform invariants",
    ):
        assert heading in page
    assert (
        page.index("<h2>Fleet</h2>")
        < page.index("<h2>Model servers</h2>")
        < page.index("<h2>Open alerts</h2>")
    )


@pytest.mark.django_db
def test_metrics_serve_every_apps_collector(operator_client):
    body = operator_client.get("/metrics").content.decode()
    for family in (
        "modelforge_nodes",
        "modelforge_model_servers",
        "modelforge_alerts_open",
        "modelforge_lb_",
    ):
        assert f"# TYPE {family}" in body
