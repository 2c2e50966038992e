from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Alerts: raise, de-duplicate, clear. Knows no domain; subjects are named, not linked."""

    name = "apps.alerts"
    label = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.alerts import (
            contributions,
            work,  # noqa: F401 -- WORK_STUCK's receivers (apps.core.work)
        )

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
