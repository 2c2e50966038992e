from django.contrib import admin, messages

from apps.artifacts import services
from apps.artifacts.models import Artifact, ArtifactEvent, Replica, ReplicaEvent
from apps.core.work_actions import WorkAdminActions
from modelforge.errors import ApiError


class ArtifactEventInline(admin.TabularInline):
    model = ArtifactEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "by", "detail")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Artifact)
class ArtifactAdmin(WorkAdminActions):
    list_display = (
        "name",
        "source_kind",
        "state",
        "state_since",
        "quarantine_rule",
        "format",
        "size_bytes",
        "created_at",
    )
    list_filter = ("state", "source_kind", "quarantine_rule")
    search_fields = ("name", "locator")
    # Quarantine is released through the API's release action (recorded who and why, checks re-run).
    readonly_fields = [f.name for f in Artifact._meta.fields]
    inlines = [ArtifactEventInline]
    actions = ["retry_work", "fail_work", "retry_acquisition"]
    work_kind = "artifact"  # requested and never taken, or acquiring by a worker that died (apps.core.work)
    state_since_from = "events__at"

    def has_add_permission(self, request):
        return False

    @admin.action(description="Retry a failed acquisition")
    def retry_acquisition(self, request, queryset):
        """The API's and the dashboard's retry (apps.artifacts.services), one message per row."""
        by = request.user.get_username()
        for artifact in queryset:
            try:
                services.retry_acquisition(artifact, by=by)
            except ApiError as exc:
                self.message_user(
                    request, f"Could not retry {artifact}: {exc.code}: {exc.message}", messages.ERROR
                )
            else:
                self.message_user(
                    request, f"Acquiring {artifact} again from {artifact.locator}.", messages.SUCCESS
                )


class ReplicaEventInline(admin.TabularInline):
    model = ReplicaEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "by", "detail")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Replica)
class ReplicaAdmin(WorkAdminActions):
    list_display = (
        "artifact",
        "node",
        "state",
        "state_since",
        "done_bytes",
        "total_bytes",
        "requested_by",
        "requested_at",
    )
    list_filter = ("state",)
    search_fields = ("artifact__name", "node__name", "name")
    # Replicas are asked for on the artifact's page or through the API, which check the artifact first.
    readonly_fields = [f.name for f in Replica._meta.fields]
    inlines = [ReplicaEventInline]
    actions = ["retry_work", "fail_work"]
    work_kind = "replica"  # requested and never started, or copying with no progress (apps.core.work)
    state_since_from = "updated_at"

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the node's copy would stay behind a record nobody sees
