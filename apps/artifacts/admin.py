from django.contrib import admin

from apps.artifacts.models import Artifact, ArtifactEvent


class ArtifactEventInline(admin.TabularInline):
    model = ArtifactEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "by", "detail")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("name", "source_kind", "state", "quarantine_rule", "format", "size_bytes", "created_at")
    list_filter = ("state", "source_kind", "quarantine_rule")
    search_fields = ("name", "locator")
    # Quarantine is released through the API's release action (recorded who and why, checks re-run).
    readonly_fields = [f.name for f in Artifact._meta.fields]
    inlines = [ArtifactEventInline]

    def has_add_permission(self, request):
        return False
