from django.contrib import admin

from apps.clusters.models import Capability, ClientCredential, Cluster, ClusterMember, RoutingTier


class ClusterMemberInline(admin.TabularInline):
    """Membership is locked while servers are attached (detach them through the API first)."""

    model = ClusterMember
    extra = 0

    def _unlocked(self, obj) -> bool:
        return obj is None or not obj.has_servers_attached()

    def has_add_permission(self, request, obj=None):
        return self._unlocked(obj)

    def has_change_permission(self, request, obj=None):
        return self._unlocked(obj)

    def has_delete_permission(self, request, obj=None):
        return self._unlocked(obj)


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "algorithm")
    inlines = [ClusterMemberInline]

    def has_delete_permission(self, request, obj=None):
        return obj is None or not obj.has_servers_attached()


@admin.register(Capability)
class CapabilityAdmin(admin.ModelAdmin):
    list_display = ("name", "description")


@admin.register(RoutingTier)
class RoutingTierAdmin(admin.ModelAdmin):
    list_display = ("capability", "tier", "cluster", "server", "weight", "project")
    list_filter = ("capability",)


@admin.register(ClientCredential)
class ClientCredentialAdmin(admin.ModelAdmin):
    list_display = ("name", "display_prefix", "project", "expires_at", "revoked_at")
    # Scopes are written exactly through the API's validation; the admin shows them, never edits them.
    readonly_fields = ("display_prefix", "scopes", "created_at", "created_by", "revoked_at")
    exclude = ("secret_hash",)

    def has_add_permission(self, request):
        return False  # minted through the API, which shows the secret once
