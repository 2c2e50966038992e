from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import path, reverse

from apps.nodes import listening
from apps.nodes.choices import Liveness
from apps.nodes.models import GPU, EnrollmentToken, ListeningClock, Node, NodeEvent
from modelforge.errors import ApiError


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in GPU._meta.fields if f.name != "id"]

    def has_add_permission(self, request, obj=None):
        return False


class NodeEventInline(admin.TabularInline):
    model = NodeEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "kind", "from_liveness", "to_liveness", "detail")
    fields = readonly_fields
    ordering = ["-at"]

    def has_add_permission(self, request, obj=None):
        return False


class LivenessNowFilter(admin.SimpleListFilter):
    """Liveness as it is now: the fleet's stale state included (models.liveness_now)."""

    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(str(value), str(label)) for value, label in Liveness.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Node]) -> QuerySet[Node]:
        value = self.value()
        return queryset.in_liveness(value) if value else queryset  # type: ignore[attr-defined]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "accelerator",
        "liveness_now",
        "enabled",
        "last_heartbeat_at",
        "secret_mismatch_at",
    )
    list_filter = (LivenessNowFilter, "enabled", "accelerator")
    search_fields = ("name", "agent_url")
    readonly_fields = [f.name for f in Node._meta.fields if f.name not in ("enabled",)]
    exclude = ("credential_hash",)
    inlines = [GPUInline, NodeEventInline]
    actions = ["enable_nodes", "disable_nodes"]

    def has_add_permission(self, request):
        return False  # nodes enroll themselves with a token

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return super().get_queryset(request).with_liveness()  # type: ignore[attr-defined]

    @admin.display(description="liveness", ordering="_liveness_now")
    def liveness_now(self, node: Node) -> str:
        return node.liveness_now

    def save_model(self, request, obj, form, change):
        # Enable/disable goes through the model method so it leaves an event row.
        if "enabled" in form.changed_data:
            Node.objects.get(pk=obj.pk).set_enabled(obj.enabled, by=request.user.get_username())

    @admin.action(description="Enable selected nodes")
    def enable_nodes(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        changed = sum(node.set_enabled(True, by=request.user.get_username()) for node in queryset)
        self.message_user(request, f"Enabled {changed} node(s).")

    @admin.action(description="Disable selected nodes")
    def disable_nodes(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        changed = sum(node.set_enabled(False, by=request.user.get_username()) for node in queryset)
        self.message_user(request, f"Disabled {changed} node(s).")


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(admin.ModelAdmin):
    list_display = ("display_prefix", "note", "state", "created_at", "expires_at", "used_at", "node")
    readonly_fields = (
        "display_prefix",
        "created_at",
        "created_by",
        "expires_at",
        "used_at",
        "node",
        "revoked_at",
    )
    fields = ("note", *readonly_fields)
    actions = ["revoke_tokens"]
    change_list_template = "admin/nodes/enrollmenttoken/change_list.html"

    def has_add_permission(self, request):
        return False  # minted by the "Mint a token" button, which shows the value once

    def get_urls(self):
        return [
            path("mint/", self.admin_site.admin_view(self.mint_view), name="nodes_enrollmenttoken_mint"),
            *super().get_urls(),
        ]

    def mint_view(self, request: HttpRequest) -> HttpResponseRedirect:
        if request.method == "POST":
            token, plain = EnrollmentToken.objects.mint(note="minted in the admin", created_by=request.user)
            messages.warning(
                request,
                f"Enrollment token (shown once, copy it now): {plain} — "
                f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC",
            )
        return HttpResponseRedirect(reverse("admin:nodes_enrollmenttoken_changelist"))

    @admin.action(description="Revoke selected unused tokens")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[EnrollmentToken]) -> None:
        revoked = sum(token.revoke() for token in queryset)
        self.message_user(request, f"Revoked {revoked} token(s).")


@admin.register(ListeningClock)
class ListeningClockAdmin(admin.ModelAdmin):
    list_display = (
        "listening_since",
        "listening_reason",
        "web_seen_at",
        "swept_at",
        "hold_since",
        "hold_nodes",
    )
    readonly_fields = [f.name for f in ListeningClock._meta.fields if f.name != "id"]
    actions = ["confirm_mass_loss"]

    def has_add_permission(self, request):
        return False  # one row, kept by the web stamps and the sweeps

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Confirm mass loss")
    def confirm_mass_loss(self, request: HttpRequest, queryset: QuerySet[ListeningClock]) -> None:
        try:
            listening.confirm_mass_loss(by=request.user.get_username())
        except ApiError as exc:
            self.message_user(request, f"{exc.code}: {exc.message}", messages.ERROR)
        else:
            self.message_user(
                request, "Mass node loss confirmed: the held nodes go offline at the next sweep."
            )


@admin.register(NodeEvent)
class NodeEventAdmin(admin.ModelAdmin):
    """Every node event, read-only: a node's page inlines its own; a transition of many nodes at once is
    one row here (``fleet_size`` nodes, no single node)."""

    list_display = ("at", "node", "kind", "from_liveness", "to_liveness", "fleet_size", "detail")
    list_filter = ("kind", "to_liveness")
    search_fields = ("node__name", "detail")
    list_select_related = ("node",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in NodeEvent._meta.fields] + ["fleet_size"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
