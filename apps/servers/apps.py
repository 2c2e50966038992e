from django.apps import AppConfig


class ServersConfig(AppConfig):
    """Model servers: runtime profiles, capacity-aware placement, remote starts through the agent."""

    name = "apps.servers"
    label = "servers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import work
        from apps.servers import (
            contributions,
            lifecycle,  # noqa: F401 -- connects the node-offline receiver
        )
        from apps.servers.work import KINDS  # its kinds of waiting work (apps.core.work)

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
        work.register(*KINDS)
