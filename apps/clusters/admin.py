from django.contrib import admin, messages
from django.db import transaction

from apps.clusters import services
from apps.clusters.models import (
    Capability,
    ClientCredential,
    Cluster,
    ClusterMember,
    ProjectLimits,
    RoutingTier,
)
from modelforge.errors import ApiError


class ClusterMemberInline(admin.TabularInline):
    """Membership is locked while servers are attached (detach them through the API first)."""

    model = ClusterMember
    extra = 0

    def _unlocked(self, obj) -> bool:
        return obj is None or not services.membership_locked(obj)

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
        return obj is None or not services.membership_locked(obj)

    def save_formset(self, request, form, formset, change):
        """Members are written through the operator rules (apps.clusters.services), like the API's and
        the dashboard's: removals, edits and additions first, attaches last (an attach locks the
        membership). The inline is hidden while locked; a refusal here is a race lost, and then nothing
        of this save is kept."""
        if formset.model is not ClusterMember:
            super().save_formset(request, form, formset, change)
            return
        formset.save(commit=False)
        cluster = form.instance
        try:
            for member in formset.deleted_objects:
                services.remove_member(member)
            attaches = []
            for member, changed in formset.changed_objects:
                fields = {f: getattr(member, f) for f in changed if f in services.MEMBER_FIELDS}
                if fields:
                    services.edit_member(member, **fields)
                if "server" in changed:
                    attaches.append((member, member.server))
            for member in formset.new_objects:
                added = services.add_member(cluster, name=member.name, gpus=member.gpus, weight=member.weight)
                member.pk = added.pk
                if member.server is not None:
                    attaches.append((added, member.server))
            for member, server in attaches:
                if server is None:
                    services.detach(member)
                else:
                    services.attach(member, server)
        except ApiError as exc:
            transaction.set_rollback(True)
            self.message_user(request, f"{exc.code}: {exc.message}", messages.ERROR)


@admin.register(Capability)
class CapabilityAdmin(admin.ModelAdmin):
    list_display = ("name", "description")


@admin.register(RoutingTier)
class RoutingTierAdmin(admin.ModelAdmin):
    list_display = ("capability", "tier", "cluster", "server", "weight", "project")
    list_filter = ("capability",)


@admin.register(ClientCredential)
class ClientCredentialAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "display_prefix", "project", "expires_at", "revoked_at")
    list_filter = ("kind",)
    # Scopes are written exactly through the API's validation; the admin shows them, never edits them.
    readonly_fields = ("kind", "display_prefix", "scopes", "created_at", "created_by", "revoked_at")
    exclude = ("secret_hash",)

    def has_add_permission(self, request):
        return False  # minted through the API, which shows the secret once


@admin.register(ProjectLimits)
class ProjectLimitsAdmin(admin.ModelAdmin):
    """Each a default for every credential of the project that leaves that limit empty."""

    list_display = (
        "project",
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrent",
        "tokens_per_day",
        "tokens_per_month",
    )
    search_fields = ("project",)
