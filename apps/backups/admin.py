from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from apps.backups import snapshot
from apps.backups.models import Backup, BackupEvent, Restore, RestorePhase
from apps.core.work_actions import WorkAdminActions
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError


class BackupEventInline(admin.TabularInline):
    model = BackupEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "detail")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Backup)
class BackupAdmin(WorkAdminActions):
    list_display = (
        "id",
        "state",
        "state_since",
        "reason_code",
        "trigger",
        "consistent_as_of",
        "size_bytes",
        "verified_at",
    )
    list_filter = ("state", "reason_code", "trigger")
    readonly_fields = [f.name for f in Backup._meta.fields]
    inlines = [BackupEventInline]
    actions = ["back_up_now", "retry_work", "fail_work"]
    work_kind = "backup"  # a queued backup nobody takes, a completed one nobody verifies (apps.core.work)
    state_since_from = "events__at"
    # The schedule is the "backup-database" row under Periodic tasks (django-celery-beat).

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # retention removes backups; a person deleting a record would orphan its files

    @admin.action(description="Back up now (the selection is ignored)")
    def back_up_now(self, request: HttpRequest, queryset: Any) -> None:
        from apps.backups.tasks import take_backup

        try:
            backup = snapshot.request_backup(trigger="operator", by=request.user.get_username())
        except ApiError as exc:
            self.message_user(request, f"{exc.code}: {exc.message}", messages.ERROR)
            return
        send_on_commit(take_backup, backup.pk)
        self.message_user(request, f"Backup #{backup.pk} queued.", messages.INFO)


class RestorePhaseInline(admin.TabularInline):
    model = RestorePhase
    extra = 0
    can_delete = False
    readonly_fields = ("name", "started_at", "finished_at", "outcome", "detail")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Restore)
class RestoreAdmin(WorkAdminActions):
    list_display = (
        "id",
        "backup",
        "state",
        "phase",
        "needs_review",
        "rpo_seconds",
        "requested_by",
        "requested_at",
    )
    list_filter = ("state", "needs_review")
    # Restores start and are reviewed from the dashboard or the API, which record who and why.
    readonly_fields = [f.name for f in Restore._meta.fields]
    inlines = [RestorePhaseInline]
    actions = ["retry_work", "fail_work"]
    work_kind = "restore"  # a queued restore nobody runs: marking it failed leaves the database untouched

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
