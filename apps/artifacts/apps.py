from django.apps import AppConfig


class ArtifactsConfig(AppConfig):
    """Artifacts: model weights with an upstream identity, supply-chain checks and quarantine."""

    name = "apps.artifacts"
    label = "artifacts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.artifacts import checks  # noqa: F401 -- registers the configuration check
        from apps.artifacts.work import KINDS  # its kinds of waiting work (apps.core.work)
        from apps.core import work
        from modelforge import lean

        work.register(*KINDS)
        # The store, served to agents beside Django (apps/artifacts/agent_views.py).
        lean.route(prefix="/api/v1/agent/artifacts/", handler="apps.artifacts.agent_views.serve")
