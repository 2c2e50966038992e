"""NOTIFY_STALLED: the worker's notification passes stamp the installation, a crashing pass records why,
and the web processes' watchdog (apps/alerts/outages.py) raises the alert from the stamp, on the
dashboard, without needing the pass that is failing (issue 47). Time is a controlled ``now``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.alerts import notify, outages
from apps.alerts.models import Alert
from apps.core.models import Installation

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(hours=1)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def stalled() -> Alert | None:
    return Alert.objects.open().filter(code=outages.NOTIFY_STALLED).first()


def worker_and_beat_seen(at: datetime) -> None:
    installation = Installation.objects.current()
    installation.record_worker_seen("worker-1", at)
    installation.record_beat_seen("beat-1", at)


def test_a_completed_pass_stamps_the_installation():
    before = timezone.now()
    assert notify.worker_pass() == {"recorded": 0, "sent": 0, "failed": 0}
    passed = Installation.objects.current().notify_passed_at
    assert passed is not None and passed >= before


def test_a_crashing_pass_records_why_and_raises_again(monkeypatch):
    def crash(now: datetime) -> tuple[int, int]:
        raise RuntimeError("a fault of our own {0}")

    monkeypatch.setattr(notify, "deliver", crash)
    with pytest.raises(RuntimeError):
        notify.worker_pass()
    installation = Installation.objects.current()
    assert installation.notify_passed_at is None
    assert installation.notify_crash == "RuntimeError: a fault of our own {0}"
    assert installation.notify_crashed_at is not None


def test_notify_stalled_is_raised_with_the_crash_shown_on_the_overview_and_cleared_by_a_pass(
    settings, client, django_user_model
):
    settings.NOTIFY_INTERVAL = 15
    limit = outages.notify_stalled_after()
    assert limit == 120
    installation = Installation.objects.current()
    installation.record_notify_pass(NOW)
    installation.record_notify_crash("KeyError: '\"error\"'", NOW + seconds(15))

    worker_and_beat_seen(NOW + seconds(limit))
    assert outages.check_notify(NOW + seconds(limit), watching_since=LONG_AGO) == "ok"
    late = NOW + seconds(limit + 1)
    worker_and_beat_seen(late)
    assert outages.check_notify(late, watching_since=LONG_AGO) == "raised"
    alert = stalled()
    assert alert is not None and alert.severity == "critical"
    assert "has not completed a pass of alert notifications (alerts.notify) since" in alert.message
    assert "Its last pass crashed at 2026-12-07 20:00:15 UTC (KeyError: '\"error\"')." in alert.message
    assert outages.check_notify(late + seconds(10), watching_since=LONG_AGO) == "missing"  # open already

    client.force_login(django_user_model.objects.create_user("ops", is_staff=True))
    page = client.get("/").content.decode()
    assert "NOTIFY_STALLED" in page and "Its last pass crashed at" in page
    assert "(KeyError: &#x27;&quot;error&quot;&#x27;)" in page  # escaped: data, not markup

    installation.record_notify_pass(late + seconds(20))
    assert outages.check_notify(late + seconds(21), watching_since=LONG_AGO) == "cleared"
    assert stalled() is None


def test_a_stall_is_not_judged_while_the_worker_or_beat_is_missing_or_before_it_was_watched(settings):
    settings.NOTIFY_INTERVAL = 15
    late = NOW + seconds(600)
    Installation.objects.current().record_notify_pass(NOW)
    # No worker seen within its limit: WORKER_MISSING names the cause, not this.
    assert outages.check_notify(late, watching_since=LONG_AGO) == "away"
    worker_and_beat_seen(late)
    # A web process that has watched for less than the limit does not judge time it did not see.
    assert outages.check_notify(late, watching_since=late - seconds(60)) == "waiting"
    assert outages.check_notify(late, watching_since=LONG_AGO) == "raised"


def test_the_web_delivers_while_notify_is_stalled():
    assert outages.NOTIFY_STALLED in outages.DELIVERY_AWAY
