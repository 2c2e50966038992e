from django.apps import AppConfig


class NodesConfig(AppConfig):
    """Nodes: enrollment, heartbeats and inventory, liveness, and the control plane's calls to agents."""

    name = "apps.nodes"
    label = "nodes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.alerts import outages
        from apps.nodes import (
            checks,  # noqa: F401 -- registers the configuration checks
            contributions,
            listening,
            signals,  # noqa: F401 -- connects the receivers
        )
        from modelforge import lean

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
        outages.LISTENING_SINCE.append(listening.listening_since)  # silence counted since listening
        # Agents' heartbeats: the control plane's hottest write, beside Django (apps/nodes/fastpath.py).
        lean.route(exact="/api/v1/agent/heartbeat", handler="apps.nodes.fastpath.endpoint")
