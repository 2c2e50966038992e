"""Outage alerts, step by step with a controlled ``now``: WORKER_MISSING and BEAT_MISSING from stale stamps,
BROKER_UNREACHABLE and DATABASE_UNREACHABLE from what one web process observed, the worker tasks that
failed on the database named, and /readyz's probes cached for a second. Real stores stopped and started
are in tests/test_outages_live.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db.utils import OperationalError

from apps.alerts import outages
from apps.alerts.models import Alert
from apps.core.models import Installation
from modelforge import health, probes
from modelforge.probes import Probe

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(hours=1)
DOWN = Probe(False, "unreachable (OperationalError)")
UP = Probe(True, "answers")


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def open_alert(code: str) -> Alert | None:
    return Alert.objects.open().filter(code=code).first()


@pytest.fixture
def failed_tasks_key() -> Iterator[None]:
    client = probes.redis_client()
    client.delete(outages.FAILED_TASKS_KEY)
    yield
    client.delete(outages.FAILED_TASKS_KEY)


# --- WORKER_MISSING -----------------------------------------------------------------------------------


def test_worker_missing_is_raised_from_a_stale_stamp_and_cleared_by_a_fresh_one(settings):
    settings.WORKER_MISSING_AFTER = 180
    Installation.objects.current().record_worker_seen("worker-a", at=NOW - seconds(100))
    assert outages.check_worker(NOW, watching_since=LONG_AGO) == "ok"
    assert open_alert(outages.WORKER_MISSING) is None

    late = NOW + seconds(81)  # 181 s since the stamp
    assert outages.check_worker(late, watching_since=LONG_AGO) == "raised"
    alert = open_alert(outages.WORKER_MISSING)
    assert alert is not None
    assert (alert.severity, alert.subject_type, alert.subject_id) == ("critical", "platform", "worker")
    assert alert.raised_at == late
    assert "since 2026-11-30 07:58:20 UTC (181 s ago" in alert.message
    assert (
        "MODELFORGE_WORKER_MISSING_AFTER" in alert.message and "celery -A modelforge worker" in alert.message
    )

    # Still missing: the same alert, not a second one.
    assert outages.check_worker(late + seconds(10), watching_since=LONG_AGO) == "missing"
    assert Alert.objects.filter(code=outages.WORKER_MISSING).count() == 1

    Installation.objects.current().record_worker_seen("worker-b", at=late + seconds(20))
    assert outages.check_worker(late + seconds(21), watching_since=LONG_AGO) == "cleared"
    alert.refresh_from_db()
    assert alert.cleared_at == late + seconds(21)
    assert alert.message.startswith("No Celery worker has run a task since")  # the raised text is kept
    assert "worker-b ran a task at 2026-11-30 08:01:41 UTC" in alert.message


def test_a_worker_is_judged_only_over_time_this_process_watched(settings):
    settings.WORKER_MISSING_AFTER = 180
    # Never seen, and this process started watching just now: not yet a verdict.
    assert outages.check_worker(NOW + seconds(179), watching_since=NOW) == "waiting"
    assert outages.check_worker(NOW + seconds(181), watching_since=NOW) == "raised"
    alert = open_alert(outages.WORKER_MISSING)
    assert alert is not None and "has ever run a task here (watched for 181 s" in alert.message
    # A process that starts later, with the stamp still stale, leaves the open alert alone.
    assert outages.check_worker(NOW + seconds(200), watching_since=NOW + seconds(190)) == "waiting"
    assert open_alert(outages.WORKER_MISSING) is not None


# --- BEAT_MISSING -------------------------------------------------------------------------------------


def test_beat_missing_is_raised_from_a_stale_stamp_and_cleared_by_a_fresh_one(settings):
    settings.BEAT_MISSING_AFTER = 120
    outages.record_beat_seen("beat-host", at=NOW)
    assert outages.check_beat(NOW + seconds(120), watching_since=LONG_AGO) == "ok"
    assert outages.check_beat(NOW + seconds(121), watching_since=LONG_AGO) == "raised"
    alert = open_alert(outages.BEAT_MISSING)
    assert alert is not None
    assert (alert.severity, alert.subject_id) == ("critical", "beat")
    assert "Celery beat has not ticked since 2026-11-30 08:00:00 UTC (121 s ago" in alert.message
    assert "MODELFORGE_BEAT_MISSING_AFTER" in alert.message

    outages.record_beat_seen("beat-host", at=NOW + seconds(130))
    assert outages.check_beat(NOW + seconds(131), watching_since=LONG_AGO) == "cleared"
    alert.refresh_from_db()
    assert alert.cleared_at == NOW + seconds(131)
    assert "beat on beat-host ticked again at 2026-11-30 08:02:10 UTC" in alert.message


# --- BROKER_UNREACHABLE -------------------------------------------------------------------------------


def test_broker_unreachable_is_raised_on_the_second_failed_check_and_cleared_with_its_window():
    watch = outages.Watch(started_at=LONG_AGO, observer="web-1:42")
    watch.broker(DOWN, NOW)
    assert open_alert(outages.BROKER_UNREACHABLE) is None  # one failed check is not an outage yet
    watch.broker(DOWN, NOW + seconds(10))
    alert = open_alert(outages.BROKER_UNREACHABLE)
    assert alert is not None and alert.severity == "critical"
    assert alert.raised_at == NOW  # from the first failed check
    assert "has not answered since 2026-11-30 08:00:00 UTC" in alert.message
    watch.broker(DOWN, NOW + seconds(20))
    assert Alert.objects.filter(code=outages.BROKER_UNREACHABLE).count() == 1

    watch.broker(UP, NOW + seconds(95))
    alert.refresh_from_db()
    assert alert.cleared_at == NOW + seconds(95)
    assert "unreachable from 2026-11-30 08:00:00 UTC to 2026-11-30 08:01:35 UTC (95 s)" in alert.message


def test_one_failed_broker_check_between_good_ones_raises_nothing():
    watch = outages.Watch(started_at=LONG_AGO, observer="web-1:42")
    watch.broker(DOWN, NOW)
    watch.broker(UP, NOW + seconds(10))
    watch.broker(DOWN, NOW + seconds(20))
    assert not Alert.objects.filter(code=outages.BROKER_UNREACHABLE).exists()


# --- DATABASE_UNREACHABLE -----------------------------------------------------------------------------


def test_a_database_outage_is_recorded_when_it_answers_again_raised_and_cleared_with_its_window(
    failed_tasks_key,
):
    watch = outages.Watch(started_at=LONG_AGO, observer="web-1:42")
    assert watch.database(DOWN, NOW) is False
    assert watch.database(DOWN, NOW + seconds(10)) is False
    assert not Alert.objects.filter(code=outages.DATABASE_UNREACHABLE).exists()
    assert watch.database(UP, NOW + seconds(95)) is True
    alert = Alert.objects.get(code=outages.DATABASE_UNREACHABLE)
    assert (alert.raised_at, alert.cleared_at) == (NOW, NOW + seconds(95))
    assert (alert.severity, alert.subject_id) == ("critical", "database")
    assert (
        "The database (PostgreSQL) did not accept a new connection from 2026-11-30 08:00:00 UTC to "
        "2026-11-30 08:01:35 UTC (95 s)" in alert.message
    )
    assert "No worker task failed on the database meanwhile." in alert.message


def test_one_failed_database_check_between_good_ones_records_nothing():
    watch = outages.Watch(started_at=LONG_AGO, observer="web-1:42")
    watch.database(DOWN, NOW)
    watch.database(UP, NOW + seconds(10))
    assert not Alert.objects.filter(code=outages.DATABASE_UNREACHABLE).exists()


def test_several_processes_seeing_one_database_outage_record_one_alert(failed_tasks_key):
    first = outages.record_database_outage(NOW, NOW + seconds(95), observer="web-1:42")
    again = outages.record_database_outage(NOW + seconds(4), NOW + seconds(98), observer="web-2:43")
    assert again.pk == first.pk
    alert = Alert.objects.get(code=outages.DATABASE_UNREACHABLE)
    assert (alert.raised_at, alert.cleared_at) == (NOW, NOW + seconds(98))
    assert "(98 s)" in alert.message
    later = outages.record_database_outage(NOW + seconds(3600), NOW + seconds(3630), observer="web-1:42")
    assert later.pk != first.pk
    assert Alert.objects.filter(code=outages.DATABASE_UNREACHABLE).count() == 2


def test_worker_tasks_that_failed_on_the_database_meanwhile_are_named(failed_tasks_key):
    gone = OperationalError("connection failed: Connection refused")
    assert outages.record_failed_task("nodes.sweep_liveness", "t1", gone, at=NOW + seconds(5))
    assert outages.record_failed_task("nodes.sweep_liveness", "t2", gone, at=NOW + seconds(10))
    assert outages.record_failed_task("alerts.notify", "t3", gone, at=NOW + seconds(15))
    assert outages.record_failed_task("backups.run", "t4", gone, at=NOW - seconds(3600))  # before
    # A task's own bug is not the database's absence.
    assert not outages.record_failed_task("servers.reconcile", "t5", ValueError("bad"), at=NOW + seconds(5))

    alert = outages.record_database_outage(NOW, NOW + seconds(95), observer="web-1:42")
    assert (
        "Worker tasks that failed on the database meanwhile: 3 (nodes.sweep_liveness: 2, "
        "alerts.notify: 1)" in alert.message
    )
    assert "backups.run" not in alert.message and "servers.reconcile" not in alert.message


def test_failed_tasks_are_unknown_when_redis_is_unreachable_too(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    probes.redis_client.cache_clear()
    try:
        assert not outages.record_failed_task("alerts.notify", "t1", OperationalError("gone"), at=NOW)
        alert = outages.record_database_outage(NOW, NOW + seconds(30), observer="web-1:42")
    finally:
        probes.redis_client.cache_clear()
    assert "Which worker tasks failed meanwhile is not known: Redis did not answer either." in alert.message


# --- the dashboard ------------------------------------------------------------------------------------


def test_the_overview_shows_open_outages_and_the_last_database_outage(client, django_user_model):
    user = django_user_model.objects.create_user("ops", password="pw-for-tests-only", is_staff=True)
    client.force_login(user)
    outages.Watch(started_at=LONG_AGO, observer="w").broker(DOWN, NOW)
    outages.Watch(started_at=LONG_AGO, observer="w").broker(DOWN, NOW + seconds(10))  # a second process
    assert open_alert(outages.BROKER_UNREACHABLE) is None  # each process counts its own checks
    watch = outages.Watch(started_at=LONG_AGO, observer="w")
    watch.broker(DOWN, NOW)
    watch.broker(DOWN, NOW + seconds(10))
    outages.record_database_outage(
        datetime.now(UTC) - seconds(100), datetime.now(UTC) - seconds(40), observer="w"
    )
    page = client.get("/").content.decode()
    assert "BROKER_UNREACHABLE" in page and "has not answered since" in page
    assert "DATABASE_UNREACHABLE" in page and "(60 s)" in page


# --- /readyz ------------------------------------------------------------------------------------------


def test_readyz_probes_are_cached_for_a_second_per_process(settings):
    health.forget_readiness()
    try:
        database, broker = health.readiness(now=100.0)
        assert database.ok and broker.ok
        settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
        probes.redis_client.cache_clear()
        assert health.readiness(now=100.9)[1].ok  # the answer of 0.9 s ago
        assert not health.readiness(now=101.1)[1].ok
    finally:
        probes.redis_client.cache_clear()
        health.forget_readiness()


def test_the_database_probe_makes_a_new_connection_each_time():
    fresh = probes.probe_database_connection()
    assert fresh.ok and fresh.detail.startswith("PostgreSQL 16")
    broken = probes.probe_database_connection(overrides={"port": 1})
    assert not broken.ok
    assert broken.detail == "database unreachable: no new connection within 2 s (OperationalError)"


def test_a_restore_bringing_back_old_stamps_raises_no_missing_worker_or_beat(settings):
    """The restored books' stamps are as old as the backup; the switch-over (listening_since) is when
    the processes' silence can start to count, so no false critical alert follows every restore."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.alerts import outages
    from apps.alerts.models import Alert
    from apps.core.models import Installation
    from apps.nodes import listening

    now = timezone.now()
    watching_since = now - timedelta(hours=1)  # this web process has watched for an hour
    Installation.objects.current()
    backup_age = timedelta(seconds=settings.BEAT_MISSING_AFTER + settings.WORKER_MISSING_AFTER + 60)
    Installation.objects.update(worker_seen_at=now - backup_age, beat_seen_at=now - backup_age)
    listening.resumed("restore 1 switched the database over", now - timedelta(seconds=5))
    assert outages.check_beat(now, watching_since) == "waiting"
    assert outages.check_worker(now, watching_since) == "waiting"
    assert not Alert.objects.filter(code__in=["BEAT_MISSING", "WORKER_MISSING"]).exists()
    # Still silent past the limit after the switch-over: then it is the processes' silence.
    later = now + timedelta(seconds=settings.BEAT_MISSING_AFTER + 1)
    assert outages.check_beat(later, watching_since) == "raised"
