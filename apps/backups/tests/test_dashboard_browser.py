"""The Backups page in a real browser: RPO exposure, a failed restore's review recorded from the page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.backups.models import Backup, BackupState, Restore
from tests.fixtures import ARTIFACTS, log_in

pytestmark = [pytest.mark.browser, pytest.mark.stack, pytest.mark.django_db(transaction=True)]


def test_an_operator_sees_rpo_exposure_and_reviews_a_failed_restore(live_web, browser):
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    at = timezone.now() - timedelta(hours=3, minutes=5)
    backup = Backup.objects.create(
        state=BackupState.VERIFIED,
        requested_at=at,
        consistent_as_of=at,
        verified_at=at,
        files=[{"name": "database.dump", "size": 1234, "sha256": "a" * 64}],
    )
    stuck = Restore.objects.create(
        backup=backup,
        requested_by="ops",
        reason="drill",
        state="failed",
        phase="restore",
        needs_review=True,
        failure_code="RESTORE_FAILED",
        failure_message="restore: the restore's process died during restore; it is not resumed",
    )
    page = browser.new_page()
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        page.goto(live_web.url + "/backups/")
        assert "3 h 5 min" in page.locator("#rpo").inner_text()
        assert "RESTORE_FAILED" in page.locator("[role=alert]").first.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-backups.png"), full_page=True)

        page.locator(f"a[href='/backups/restores/{stuck.pk}/']").first.click()
        page.fill("form[action$='/abandon'] input[name=reason]", "drill over, nothing to keep")
        page.click("form[action$='/abandon'] button")
        page.wait_for_selector("text=abandon recorded")
        page.screenshot(path=str(ARTIFACTS / "dashboard-restore-reviewed.png"), full_page=True)
    finally:
        page.close()
    stuck.refresh_from_db()
    assert (stuck.needs_review, stuck.review_decision, stuck.reviewed_by) == (False, "abandon", "ops")
    assert stuck.review_note == "drill over, nothing to keep"
