from django.apps import AppConfig


class ClustersConfig(AppConfig):
    """Clusters, capabilities, routing tiers, client credentials: what the serving gateway routes by."""

    name = "apps.clusters"
    label = "clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.clusters import (
            checks,  # noqa: F401 -- registers the gateway's configuration check
            contributions,
            routing,  # noqa: F401 -- connects the routing-table invalidation
        )
        from apps.clusters.usage import server_usage
        from apps.servers.usage import register_usage

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
        register_usage(server_usage)  # servers' "used by" asks clusters without importing them
