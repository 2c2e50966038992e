"""Verifying a backup again: one rule (apps.backups.services.request_verification) for the API and the
dashboard; nothing is sent for a backup that is neither completed nor verified."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.backups.models import Backup

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


def test_the_api_sends_a_verification_of_a_completed_backup(
    operator_client, django_capture_on_commit_callbacks
):
    backup = Backup.objects.create(state="completed")
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/backups/{backup.pk}/verify")
    assert response.status_code == 202
    assert len(sent) == 1


def test_the_api_sends_nothing_for_a_failed_backup(operator_client, django_capture_on_commit_callbacks):
    backup = Backup.objects.create(state="failed")
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/backups/{backup.pk}/verify")
    assert response.status_code == 200
    assert sent == []


# Regression: the dashboard said "Verifying again" and sent a task that then skipped in silence.
def test_the_dashboard_sends_nothing_for_a_failed_backup_and_says_so(
    staff, django_capture_on_commit_callbacks
):
    backup = Backup.objects.create(state="failed")
    with django_capture_on_commit_callbacks() as sent:
        page = staff.post(f"/backups/{backup.pk}/verify", follow=True).content.decode()
    assert f"Backup #{backup.pk} is failed: there is nothing to verify." in page
    assert sent == []


def test_the_dashboard_sends_a_verification_of_a_verified_backup(staff, django_capture_on_commit_callbacks):
    backup = Backup.objects.create(state="verified")
    with django_capture_on_commit_callbacks() as sent:
        page = staff.post(f"/backups/{backup.pk}/verify", follow=True).content.decode()
    assert f"Verifying backup #{backup.pk} again." in page
    assert len(sent) == 1
