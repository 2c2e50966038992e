from django.contrib import admin

from apps.observability.models import HostSample, TelemetrySample, TrafficSample, UsageSample


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


@admin.register(HostSample)
class HostSampleAdmin(admin.ModelAdmin):
    list_display = ("node_name", "at", "memory_total_bytes", "memory_available_bytes", "load_1m", "cpu_count")
    list_filter = ("node_name",)
    readonly_fields = [f.name for f in HostSample._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(UsageSample)
class UsageSampleAdmin(admin.ModelAdmin):
    list_display = ("minute", "credential", "project", "capability", "backend", "requests", "errors")
    list_filter = ("capability",)
    search_fields = ("credential", "project", "capability", "backend")
    readonly_fields = [f.name for f in UsageSample._meta.fields]

    def has_add_permission(self, request):
        return False
