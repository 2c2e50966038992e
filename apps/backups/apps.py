from django.apps import AppConfig


class BackupsConfig(AppConfig):
    """Backups: verified snapshots of the control-plane database, staleness, phased restore."""

    name = "apps.backups"
    label = "backups"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.backups import contributions
        from apps.backups.work import KINDS  # its kinds of waiting work (apps.core.work)
        from apps.core import work

        contributions.register()  # invariants, overview card, metrics (apps.core.registry)
        work.register(*KINDS)
