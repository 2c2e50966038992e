from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.core.work_actions import WorkAdminActions
from apps.nodes.engine_signals import engine_view
from apps.servers import services
from apps.servers.choices import TERMINAL
from apps.servers.models import ModelServer, Reservation, ServerEvent, ServerTombstone
from modelforge.errors import ApiError


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
class ModelServerAdmin(WorkAdminActions):
    list_display = (
        "name",
        "profile",
        "model",
        "state",
        "state_since",
        "node",
        "gpus_wanted",
        "created_at",
        "failure_code",
        "restart_policy",
        "restart_attempts",
    )
    list_filter = ("state", "profile", "restart_policy")
    search_fields = ("name", "model", "node__name")
    readonly_fields = [*(f.name for f in ModelServer._meta.fields), "engine_load"]
    inlines = [ReservationInline, ServerEventInline]

    @admin.display(description="engine load")
    def engine_load(self, server: ModelServer) -> str:
        """The engine's own load as its node last reported it (apps/nodes/engine_signals.py)."""
        view = engine_view(str(server.pk), str(server.node_id) if server.node_id else None)
        if view.signals is None:
            return "unknown (Redis did not answer)" if view.state == "unknown" else "not reported"
        kv = "KV cache not reported" if view.kv_percent is None else f"KV cache {view.kv_percent} % used"
        stale = ", stale" if view.state == "stale" else ""
        return f"{view.signals.running} running, {view.signals.waiting} waiting, {kv}{stale}"

    actions = [
        "stop_servers",
        "restart_servers",
        "replace_servers",
        "delete_servers",
        "retry_work",
        "fail_work",
    ]
    work_kind = "server"  # starting or stopping past its bound (apps.core.work)
    state_since_from = "events__at"

    def has_add_permission(self, request):
        return False  # placing needs the scheduler's answer: use the dashboard or the API

    def has_delete_permission(self, request, obj=None):
        # A server that holds memory or may have a process is stopped first, never deleted under it.
        return obj is None or obj.state in TERMINAL

    @admin.action(description="Stop selected servers")
    def stop_servers(self, request: HttpRequest, queryset: QuerySet[ModelServer]) -> None:
        stopped = services.stop_each(queryset, by=services.operator_name(request.user))
        self.message_user(request, f"Stopping {stopped} server(s).")

    def delete_model(self, request: HttpRequest, obj: ModelServer) -> None:
        # The change form's Delete goes through services.delete too: a failed server leaves its tombstone.
        services.delete(obj, by=services.operator_name(request.user))

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Django's bulk delete would skip the tombstone and the alert: "Delete (with tombstone)" replaces it.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def _recover(
        self,
        request: HttpRequest,
        queryset: QuerySet[ModelServer],
        act: Callable[[ModelServer, str], Any],
        verb: str,
    ) -> None:
        """One message per server: what was done, or the refusal's code and message."""
        by = services.operator_name(request.user)
        for server in queryset.select_related("node"):
            name = server.name
            try:
                result = act(server, by)
            except ApiError as exc:
                self.message_user(
                    request, f"Could not {verb} {name}: {exc.code}: {exc.message}", messages.ERROR
                )
            else:
                where = f" on {result.node}; starting" if isinstance(result, ModelServer) else ""
                self.message_user(request, f"{verb.capitalize()}: {name}{where}.", messages.SUCCESS)

    @admin.action(description="Restart (failed servers, on their own node)")
    def restart_servers(self, request: HttpRequest, queryset: QuerySet[ModelServer]) -> None:
        self._recover(request, queryset, services.restart, "restart")

    @admin.action(description="Re-place (failed servers, wherever there is room)")
    def replace_servers(self, request: HttpRequest, queryset: QuerySet[ModelServer]) -> None:
        self._recover(request, queryset, services.replace, "re-place")

    @admin.action(description="Delete (with tombstone)")
    def delete_servers(self, request: HttpRequest, queryset: QuerySet[ModelServer]) -> None:
        self._recover(request, queryset, services.delete, "delete")


@admin.register(ServerTombstone)
class ServerTombstoneAdmin(admin.ModelAdmin):
    list_display = ("name", "server_id", "node", "deleted_by", "deleted_at")
    search_fields = ("name", "server_id", "deleted_by")
    readonly_fields = [f.name for f in ServerTombstone._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # reconcile stops the copy the tombstone names; the row is its record
