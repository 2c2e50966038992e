from django.apps import AppConfig


class ClustersConfig(AppConfig):
    """Clusters, capabilities, routing tiers, client credentials: what the serving gateway (apps/gateway)
    routes by."""

    name = "apps.clusters"
    label = "clusters"
    default_auto_field = "django.db.models.BigAutoField"
