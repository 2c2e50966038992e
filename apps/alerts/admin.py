from django.contrib import admin

from apps.alerts.models import Alert


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
