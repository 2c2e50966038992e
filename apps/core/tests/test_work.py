"""The stuck-work watchdog's rules, row by row, with time controlled: re-send after the bound, WORK_STUCK
after the stuck bound (cleared when the row moves on), a starting server whose watch is gone judged from
here with its reservation released, and nothing re-sent or raised for work that is moving."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.alerts.models import Alert
from apps.artifacts.models import Artifact
from apps.backups.models import Backup
from apps.core import work
from apps.nodes.tests.factories import make_node
from apps.servers.models import ModelServer, Reservation
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


def stuck_alerts() -> list[tuple[str, str]]:
    return sorted(Alert.objects.open().filter(code="WORK_STUCK").values_list("subject_type", "subject_name"))


def test_a_queued_backup_is_re_sent_after_its_bound_and_stuck_after_the_next(settings):
    backup = Backup.objects.create()
    now = timezone.now()
    assert work.watch(now)["resent"] == 0  # just queued: the first message may still be on its way
    assert work.watch(now + timedelta(seconds=settings.WORK_RESEND_AFTER + 1))["resent"] == 1
    assert stuck_alerts() == []
    later = now + timedelta(seconds=settings.WORK_STUCK_AFTER + 1)
    assert work.watch(later)["stuck"] == 1
    (alert,) = Alert.objects.open().filter(code="WORK_STUCK")
    assert (alert.subject_type, alert.subject_id, alert.subject_name) == (
        "backup",
        str(backup.pk),
        f"backup #{backup.pk}",
    )
    assert (
        "waiting for a worker to take it" in alert.message and "/api/v1/system/work/backup/" in alert.message
    )
    # The operator marks it failed: the alert clears, and later backups are no longer blocked.
    work.fail("backup", str(backup.pk), by="alice")
    backup.refresh_from_db()
    assert (backup.state, backup.reason_code) == ("failed", "WORK_CANCELLED")
    assert "marked failed by alice" in backup.reason_message
    assert stuck_alerts() == []
    assert work.watch(later)["stuck"] == 0


def test_a_row_that_moved_on_clears_its_alert_at_the_next_watch(settings):
    artifact = Artifact.objects.create(name="m", source_kind="http", locator="https://example.invalid/m")
    later = timezone.now() + timedelta(seconds=settings.WORK_STUCK_AFTER + 1)
    work.watch(later)
    assert stuck_alerts() == [("artifact", "m")]
    Artifact.objects.filter(pk=artifact.pk).update(state="ready")
    work.watch(later)
    assert stuck_alerts() == []


def test_operator_actions_refuse_what_is_not_waiting_by_name():
    backup = Backup.objects.create(state="verified")
    with pytest.raises(ApiError) as refused:
        work.fail("backup", str(backup.pk), by="alice")
    assert (refused.value.code, refused.value.status) == ("WORK_NOT_WAITING", 409)
    with pytest.raises(ApiError) as unknown:
        work.retry("bakcup", "1", by="alice")
    assert (unknown.value.code, unknown.value.status) == ("WORK_KIND_UNKNOWN", 404)


def test_a_starting_server_whose_watch_is_gone_is_judged_here_and_its_reservation_released(settings):
    node, _ = make_node(name="gone", accelerator="cpu", agent_url="http://127.0.0.1:9")  # nothing listens
    server = ModelServer.objects.create(name="s", profile="test-echo", model="m", node=node, pid=4242)
    server.transition("placing")
    Reservation.objects.create(server=server, node=node, bytes=1)
    server.transition("starting")
    assert work.watch()["looked"] >= 0
    assert ModelServer.objects.get(pk=server.pk).state == "starting"  # not yet past the re-send bound
    work.watch(timezone.now() + timedelta(seconds=settings.WORK_RESEND_AFTER + 1))
    server.refresh_from_db()
    assert server.state == "failed" and server.failure_code == "AGENT_UNREACHABLE"
    assert not Reservation.objects.filter(server=server).exists()


def test_kinds_are_listed_by_position_whatever_order_their_apps_register_them_in():
    """Each app registers its kinds at ready() (INSTALLED_APPS order: servers before artifacts before
    backups); the page, the API's enum and the refusal list them as they always did."""
    order = ["backup", "restore", "server", "artifact", "replica"]
    assert list(work.KINDS) == order
    kinds = list(work.KINDS.values())
    try:
        work.register(*reversed(kinds))
        assert list(work.KINDS) == order
    finally:
        work.register(*kinds)
