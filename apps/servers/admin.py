from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.servers.choices import TERMINAL
from apps.servers.models import ModelServer, Reservation, ServerEvent


class ReservationInline(admin.TabularInline):
    model = Reservation
    extra = 0
    can_delete = False
    readonly_fields = ("node", "gpu", "bytes", "created_at")

    def has_add_permission(self, request, obj=None):
        return False


class ServerEventInline(admin.TabularInline):
    model = ServerEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "detail")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ModelServer)
class ModelServerAdmin(admin.ModelAdmin):
    list_display = ("name", "profile", "model", "state", "node", "gpus_wanted", "created_at", "failure_code")
    list_filter = ("state", "profile")
    search_fields = ("name", "model", "node__name")
    readonly_fields = [f.name for f in ModelServer._meta.fields]
    inlines = [ReservationInline, ServerEventInline]
    actions = ["stop_servers"]

    def has_add_permission(self, request):
        return False  # placing needs the scheduler's answer: use the dashboard or the API

    def has_delete_permission(self, request, obj=None):
        # A server that holds memory or may have a process is stopped first, never deleted under it.
        return obj is None or obj.state in TERMINAL

    @admin.action(description="Stop selected servers")
    def stop_servers(self, request: HttpRequest, queryset: QuerySet[ModelServer]) -> None:
        stopped = 0
        for server in queryset.filter(state__in=["starting", "running"]):
            server.request_stop(by=request.user.get_username())
            stopped += 1
        self.message_user(request, f"Stopping {stopped} server(s).")
