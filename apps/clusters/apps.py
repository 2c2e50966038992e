from typing import Any

from django.apps import AppConfig


class ClustersConfig(AppConfig):
    """Clusters, capabilities, routing tiers, client credentials: what the serving gateway (apps/gateway)
    routes by."""

    name = "apps.clusters"
    label = "clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from apps.clusters import contributions
        from apps.clusters.usage import server_usage
        from apps.servers.usage import register_usage

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
        register_usage(server_usage)  # servers' "used by" asks clusters without importing them
        # Logging out ends the Playground's credentials of that session (apps/clusters/playground.py).
        user_logged_out.connect(_revoke_playground_credentials, dispatch_uid="clusters.playground.logout")


def _revoke_playground_credentials(sender: Any, request: Any = None, **kwargs: Any) -> None:
    from apps.clusters.playground import revoke_session_credentials

    if request is not None and hasattr(request, "session"):
        revoke_session_credentials(request.session)
