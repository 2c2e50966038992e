"""Backups and restores move only through StatefulModel.transition(): allowed moves, compare-and-swap,
an event row per backup move."""

from __future__ import annotations

import pytest

from apps.backups.models import Backup, Restore
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


def test_a_backup_move_leaves_an_event_row_and_updates_the_instance():
    backup = Backup.objects.create()
    backup.transition("running", detail="claimed", phase="destination")
    backup.refresh_from_db()
    assert (backup.state, backup.phase) == ("running", "destination")
    event = backup.events.get()
    assert (event.from_state, event.to_state, event.detail) == ("queued", "running", "claimed")


def test_a_move_the_backup_does_not_allow_is_refused_with_its_own_code():
    backup = Backup.objects.create(state="expired")
    with pytest.raises(ApiError) as refused:
        backup.transition("verified")
    assert (refused.value.code, refused.value.status) == ("INVALID_BACKUP_STATE", 409)
    assert refused.value.message == f"Backup #{backup.pk} is expired; it cannot become verified."
    assert not backup.events.exists()


def test_a_backup_another_process_moved_first_is_not_overwritten():
    backup = Backup.objects.create(state="completed")
    stale = Backup.objects.get(pk=backup.pk)
    backup.transition("failed", reason_code="WORK_CANCELLED")
    with pytest.raises(ApiError) as refused:
        stale.transition("verified")
    assert refused.value.code == "INVALID_BACKUP_STATE"
    assert "changed to failed meanwhile" in refused.value.message
    backup.refresh_from_db()
    assert (backup.state, backup.reason_code) == ("failed", "WORK_CANCELLED")
    assert backup.events.count() == 1


def test_a_restore_moves_with_a_compare_and_swap_too():
    backup = Backup.objects.create(state="verified")
    restore = Restore.objects.create(backup=backup, requested_by="ops", reason="drill")
    stale = Restore.objects.get(pk=restore.pk)
    restore.transition("running")
    with pytest.raises(ApiError) as refused:
        stale.transition("running")
    assert refused.value.code == "INVALID_RESTORE_STATE"
    with pytest.raises(ApiError):
        restore.transition("queued")
    restore.transition("completed", phase="")
    assert Restore.objects.get(pk=restore.pk).state == "completed"
