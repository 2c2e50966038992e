from django.apps import AppConfig


class ServersConfig(AppConfig):
    """Model servers: runtime profiles, capacity-aware placement, remote starts through the agent."""

    name = "apps.servers"
    label = "servers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from apps.core import work
        from apps.servers import (
            contributions,
            lifecycle,  # noqa: F401 -- connects the node-offline receiver
            profiles,
        )
        from apps.servers.work import KINDS  # its kinds of waiting work (apps.core.work)
        from modelforge.config import Problem

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
        work.register(*KINDS)
        # The runtime profiles load here, not while the settings load (settings import no app). Their
        # problems (INVALID_MANIFEST, CONFIG_NOT_MOUNTED) join the configuration's, which every entry
        # point checks after django.setup(): production refuses to start on a bad manifest, as before.
        settings.MODELFORGE_CONFIG_PROBLEMS.extend(
            Problem(problem.code, problem.where, problem.message)
            for problem in profiles.install(settings.CONFIG_DIR)
        )
