from django.contrib import admin

from apps.alerts.models import Alert, Notification, NotificationChannel


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = (
        "code",
        "severity",
        "subject_type",
        "subject_name",
        "raised_at",
        "cleared_at",
        "occurrences",
    )
    list_filter = ("severity", "code", "subject_type", ("cleared_at", admin.EmptyFieldListFilter))
    search_fields = ("code", "subject_name", "subject_id", "message")
    readonly_fields = [f.name for f in Alert._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "target", "min_severity", "enabled", "last_success_at", "last_failure_at")
    list_filter = ("kind", "enabled", "min_severity")
    search_fields = ("name", "target")
    readonly_fields = ("created_at", "created_by", "last_success_at", "last_failure_at", "last_error")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("alert", "event", "channel", "state", "attempts", "next_attempt_at", "sent_at")
    list_filter = ("state", "event", "channel")
    readonly_fields = [f.name for f in Notification._meta.fields]

    def has_add_permission(self, request):
        return False
