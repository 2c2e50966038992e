from django.contrib import admin

from apps.clusters.models import Capability, ClientCredential, Cluster, ClusterMember, RoutingTier


class ClusterMemberInline(admin.TabularInline):
    model = ClusterMember
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "algorithm")
    inlines = [ClusterMemberInline]


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
    readonly_fields = ("display_prefix", "created_at", "created_by", "revoked_at")
    exclude = ("secret_hash",)

    def has_add_permission(self, request):
        return False  # minted through the API, which shows the secret once
