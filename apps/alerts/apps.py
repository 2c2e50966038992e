from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Alerts: raise, de-duplicate, clear. Knows no domain; subjects are named, not linked."""

    name = "apps.alerts"
    label = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.alerts import (
            contributions,
            signals,  # noqa: F401 -- the outage checks' process receivers (modelforge.signals)
            work,  # noqa: F401 -- WORK_STUCK's receivers (apps.core.work)
        )
        from apps.alerts.outages import recent_outages
        from apps.core import outages

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
        outages.provide(recent_outages)  # the home page's outage card (apps.core.outages)
