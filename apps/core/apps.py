from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The platform itself: the installation record, system status, the dashboard shell."""

    name = "apps.core"
    label = "core"
    verbose_name = "Platform"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # `manage.py check` reports configuration problems as system checks (modelforge/checks.py).
        from modelforge import checks  # noqa: F401
