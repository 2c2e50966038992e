"""The operator surface of backups: the API through a real Celery worker, refusals as envelopes,
point-in-time recovery NOT_SUPPORTED, BACKUP_STALE with time controlled, retention, the dashboard."""

from __future__ import annotations

import importlib
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from apps.alerts.models import Alert
from apps.backups import codes, snapshot
from apps.backups.models import Backup, BackupState, Restore
from apps.core.models import Installation
from tests.fixtures import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def verified_backup(directory: Path | None = None, *, at=None, **fields) -> Backup:
    """A verified backup record (its files are what the record says; used where only the record matters)."""
    at = at or timezone.now()
    if directory is not None:
        directory.mkdir(parents=True)
        (directory / "database.dump").write_bytes(b"x")
    return Backup.objects.create(
        state=BackupState.VERIFIED,
        requested_at=at,
        consistent_as_of=at,
        verified_at=at,
        directory=str(directory or ""),
        files=[{"name": "database.dump", "size": 1, "sha256": "0" * 64}],
        **fields,
    )


def test_a_backup_requested_through_the_api_is_taken_and_verified_by_the_worker(
    operator_client, celery_worker_process
):
    Path(settings.BACKUP_ROOT).mkdir(parents=True, exist_ok=True)
    response = operator_client.post("/api/v1/backups")
    assert response.status_code == 202, response.content
    backup_id = response.json()["id"]
    assert response.json()["state"] == "queued"

    def verified() -> bool:
        return Backup.objects.get(pk=backup_id).state in (BackupState.VERIFIED, BackupState.FAILED)

    assert wait_until(verified, 90, 0.3), celery_worker_process.log()[-3000:]
    body = operator_client.get(f"/api/v1/backups/{backup_id}").json()
    assert body["state"] == "verified" and body["restore_eligible"] is True, body
    assert body["files"][0]["name"] == "database.dump"
    summary = operator_client.get("/api/v1/backups/summary").json()
    assert summary["newest_verified"]["id"] == backup_id
    assert 0 <= summary["rpo_exposure_seconds"] < 120


def test_a_second_backup_while_one_is_queued_is_refused_with_its_code(operator_client):
    Backup.objects.create()
    response = operator_client.post("/api/v1/backups")
    assert response.status_code == 409
    assert response.json()["code"] == codes.BACKUP_IN_PROGRESS
    assert set(response.json()) == {"code", "message", "correlation_id"}


def test_point_in_time_recovery_is_not_supported(operator_client):
    backup = verified_backup()
    response = operator_client.post(
        "/api/v1/restores",
        {"backup": backup.pk, "reason": "oops", "point_in_time": "2026-11-29T10:00:00Z"},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["code"] == codes.NOT_SUPPORTED
    assert not Restore.objects.exists()


def test_only_a_verified_backup_can_be_restored(operator_client):
    for state in (BackupState.COMPLETED, BackupState.FAILED, BackupState.RUNNING, BackupState.EXPIRED):
        backup = Backup.objects.create(state=state)
        response = operator_client.post(
            "/api/v1/restores", {"backup": backup.pk, "reason": "x"}, format="json"
        )
        assert response.status_code == 409, state
        assert response.json()["code"] == codes.BACKUP_NOT_RESTORE_ELIGIBLE
    assert not Restore.objects.exists()


def test_a_restore_needs_a_reason_and_an_operator(operator_client, anonymous_client):
    backup = verified_backup()
    response = operator_client.post("/api/v1/restores", {"backup": backup.pk, "reason": "  "}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "VALIDATION_ERROR"
    response = anonymous_client.post("/api/v1/restores", {"backup": backup.pk, "reason": "x"}, format="json")
    assert response.status_code in (401, 403) and "code" in response.json()
    assert not Restore.objects.exists()


def test_a_restore_awaiting_review_refuses_the_next_one_and_review_records_who_and_why(operator_client):
    backup = verified_backup()
    stuck = Restore.objects.create(
        backup=backup,
        requested_by="a",
        reason="r",
        state="failed",
        needs_review=True,
        failure_code="RESTORE_FAILED",
    )
    response = operator_client.post(
        "/api/v1/restores", {"backup": backup.pk, "reason": "again"}, format="json"
    )
    assert response.status_code == 409 and response.json()["code"] == codes.RESTORE_FAILED
    assert f"#{stuck.pk}" in response.json()["message"]

    response = operator_client.post(f"/api/v1/restores/{stuck.pk}/acknowledge", {"reason": ""}, format="json")
    assert response.status_code == 400
    response = operator_client.post(
        f"/api/v1/restores/{stuck.pk}/acknowledge", {"reason": "seen"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["review_decision"] == "acknowledge" and response.json()["needs_review"] is False
    response = operator_client.post(
        f"/api/v1/restores/{stuck.pk}/abandon", {"reason": "twice"}, format="json"
    )
    assert response.status_code == 409 and response.json()["code"] == codes.RESTORE_NOT_REVIEWABLE


def test_backup_stale_is_raised_and_cleared_with_time_controlled(settings):
    settings.BACKUP_STALE_AFTER = 3600
    installed = Installation.objects.current().created_at
    # A new installation is measured from when it was installed.
    with time_machine.travel(installed + timedelta(minutes=30)):
        assert snapshot.check_staleness() is False
    with time_machine.travel(installed + timedelta(minutes=61)):
        assert snapshot.check_staleness() is True
        alert = Alert.objects.open().get(code=codes.BACKUP_STALE)
        assert "No verified backup" in alert.message
        verified_backup(at=timezone.now())
        assert snapshot.check_staleness() is False
        assert not Alert.objects.open().filter(code=codes.BACKUP_STALE).exists()
    with time_machine.travel(installed + timedelta(minutes=61 + 59)):
        assert snapshot.check_staleness() is False
    with time_machine.travel(installed + timedelta(minutes=61 + 61)):
        assert snapshot.check_staleness() is True
        assert "over the 1.0 h threshold" in Alert.objects.open().get(code=codes.BACKUP_STALE).message
    # A failed backup is not a fresh one; only a verified one clears it.
    with time_machine.travel(installed + timedelta(minutes=130)):
        Backup.objects.create(state=BackupState.FAILED, consistent_as_of=timezone.now())
        assert snapshot.check_staleness() is True


def test_retention_never_expires_the_newest_verified_backup(tmp_path, settings):
    settings.BACKUP_KEEP, settings.BACKUP_KEEP_DAYS = 2, 7
    now = timezone.now()
    old = [verified_backup(tmp_path / f"b{i}", at=now - timedelta(days=30 - i)) for i in range(4)]
    newest_failed = Backup.objects.create(state=BackupState.FAILED, requested_at=now)
    expired = snapshot.prune(now)
    assert sorted(expired) == [old[0].pk, old[1].pk]
    for backup in old[:2]:
        backup.refresh_from_db()
        assert backup.state == BackupState.EXPIRED and not Path(backup.directory).exists()
    assert all(Path(b.directory).exists() for b in old[2:])
    newest_failed.refresh_from_db()
    assert newest_failed.state == BackupState.FAILED

    # Past both limits, the newest verified backup survives whatever its age (a newer one that is only
    # completed is no recovery point).
    settings.BACKUP_KEEP = 1
    Backup.objects.filter(pk=old[3].pk).update(state=BackupState.COMPLETED)
    assert snapshot.prune(now) == []
    old[2].refresh_from_db()
    assert old[2].state == BackupState.VERIFIED


def test_the_schedule_is_an_editable_beat_row_naming_a_real_task():
    from django.apps import apps as registry

    from modelforge.celery import app

    # The data migration's own function (transactional tests flush the row it made at migrate time).
    schedule = importlib.import_module("apps.backups.migrations.0002_backup_schedule")
    PeriodicTask.objects.filter(name="backup-database").delete()
    schedule.create_schedule(registry, None)
    schedule.create_schedule(registry, None)  # idempotent, and never overwrites an operator's edit
    row = PeriodicTask.objects.get(name="backup-database")
    assert (
        row.task in app.tasks
        and row.crontab is not None
        and (row.crontab.hour, row.crontab.minute) == ("2", "0")
    )
    assert settings.CELERY_BEAT_SCHEDULE["backup-housekeeping"]["task"] in app.tasks


def test_the_dashboard_shows_rpo_exposure_and_takes_a_backup(client: Client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    backup = verified_backup(at=timezone.now() - timedelta(hours=2))
    page = client.get("/backups/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "RPO exposure" in text and "2 h 0 min" in text and f"#{backup.pk}" in text
    assert client.get(f"/backups/{backup.pk}/").status_code == 200
    response = client.post("/backups/now")
    assert response.status_code == 302
    assert Backup.objects.filter(state=BackupState.QUEUED, requested_by="ops").count() == 1
