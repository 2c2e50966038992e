"""The alerts core: raise once, count repeats, clear, raise anew; list and filter."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.alerts.models import Alert, AroundName

pytestmark = pytest.mark.django_db


def test_raising_an_open_alert_again_does_not_duplicate_it():
    assert Alert.objects.raise_alert("node_offline", "critical", "node", "n1", "gpu-1", "down") is True
    assert Alert.objects.raise_alert("node_offline", "critical", "node", "n1", "gpu-1", "still down") is False
    alert = Alert.objects.get()
    assert alert.occurrences == 2
    assert alert.message == "still down"


def test_a_cleared_alert_raised_again_opens_a_new_one():
    Alert.objects.raise_alert("NODE_STALE", "warning", "node", "n1", "gpu-1", "stale")
    assert Alert.objects.clear_for(["NODE_STALE"], "node", "n1") == 1
    assert Alert.objects.clear_for(["NODE_STALE"], "node", "n1") == 0
    Alert.objects.raise_alert("NODE_STALE", "warning", "node", "n1", "gpu-1", "stale again")
    assert Alert.objects.count() == 2
    assert Alert.objects.open().count() == 1


def test_raise_many_opens_only_what_is_not_open():
    Alert.objects.raise_alert("node_offline", "critical", "node", "a", "A", "x")
    opened = Alert.objects.raise_many(
        "node_offline", "critical", "node", [("a", "A"), ("b", "B")], AroundName("", " down")
    )
    assert opened == 1
    assert Alert.objects.get(subject_id="b").message == "B down"


@pytest.mark.parametrize(
    "pieces",
    [
        ("Node ", " is offline: {{braces}} kept, 100 % sure"),
        ("", "", ""),
        ("no name at all",),
        ("",),
        ("'", "' quoted {name!r}"),
    ],
)
def test_raise_many_puts_the_name_between_the_pieces_as_join_would(pieces):
    subjects = [("a", "gpu-a"), ("b", "it's {b}"), ("c", 'q"uo\\te')]
    message = AroundName(*pieces)
    assert Alert.objects.raise_many("node_offline", "critical", "node", subjects, message) == 3
    for subject_id, name in subjects:
        alert = Alert.objects.get(subject_id=subject_id)
        assert alert.message == name.join(pieces) == message.for_name(name)
        assert (alert.subject_name, alert.dedup_key) == (name, f"node_offline:node:{subject_id}")


def test_raise_many_over_many_subjects_is_one_statement_and_counts_repeats():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    subjects = [(f"n{i}", f"node-{i}") for i in range(500)]
    with CaptureQueriesContext(connection) as queries:
        stale = AroundName("", " stale")
        assert Alert.objects.raise_many("NODE_STALE", "warning", "node", subjects, stale) == 500
    assert len(queries.captured_queries) == 1
    again = AroundName("", " again")
    assert Alert.objects.raise_many("NODE_STALE", "warning", "node", subjects[:10], again) == 0
    assert Alert.objects.filter(occurrences=2).count() == 10
    assert Alert.objects.get(subject_id="n3").message == "node-3 again"


def test_the_api_lists_and_filters_alerts(operator_client):
    Alert.objects.raise_alert("node_offline", "critical", "node", "a", "A", "x")
    Alert.objects.raise_alert("NODE_STALE", "warning", "node", "b", "B", "y")
    Alert.objects.clear_for(["NODE_STALE"], "node", "b")
    everything = operator_client.get("/api/v1/alerts").json()
    assert everything["count"] == 2
    open_only = operator_client.get("/api/v1/alerts?open=true").json()["results"]
    assert [a["code"] for a in open_only] == ["node_offline"]
    critical = operator_client.get("/api/v1/alerts?severity=critical").json()["results"]
    assert [a["subject_name"] for a in critical] == ["A"]
    assert operator_client.get("/api/v1/alerts?severity=loud").status_code == 400


def test_the_dashboard_lists_open_alerts_by_default(client):
    Alert.objects.raise_alert("node_offline", "critical", "node", "a", "gpu-a", "gpu-a is offline")
    Alert.objects.raise_alert("NODE_STALE", "warning", "node", "b", "gpu-b", "gpu-b is stale")
    Alert.objects.clear_for(["NODE_STALE"], "node", "b")
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/alerts/")
    assert b"gpu-a is offline" in page.content and b"gpu-b is stale" not in page.content
    cleared = client.get("/alerts/?open=false")
    assert b"gpu-b is stale" in cleared.content
