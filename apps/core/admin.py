from django.contrib import admin

from apps.core.models import Installation


@admin.register(Installation)
class InstallationAdmin(admin.ModelAdmin):
    list_display = (
        "installation_id",
        "created_by_release",
        "created_at",
        "worker_seen_at",
        "worker_seen_hostname",
        "beat_seen_at",
        "beat_seen_hostname",
        "notify_passed_at",
    )
    readonly_fields = (*list_display, "notify_crashed_at", "notify_crash")

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
