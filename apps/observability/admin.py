from django.contrib import admin

from apps.observability.models import TelemetrySample, TrafficSample


@admin.register(TelemetrySample)
class TelemetrySampleAdmin(admin.ModelAdmin):
    list_display = (
        "node_name",
        "gpu_index",
        "at",
        "memory_used_bytes",
        "utilization_percent",
        "temperature_c",
    )
    list_filter = ("node_name",)
    readonly_fields = [f.name for f in TelemetrySample._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(TrafficSample)
class TrafficSampleAdmin(admin.ModelAdmin):
    list_display = ("backend", "minute", "requests", "errors")
    readonly_fields = [f.name for f in TrafficSample._meta.fields]

    def has_add_permission(self, request):
        return False
