from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The platform itself: the installation record, system status, the dashboard shell."""

    name = "apps.core"
    label = "core"
    verbose_name = "Platform"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import contributions

        # `manage.py check` reports configuration problems as system checks (modelforge/checks.py).
        # Every Django process (web, manage.py, the worker) sends tasks through this application: loaded
        # here, not in modelforge/__init__.py, which make run imports before it can take Ctrl-C.
        from modelforge import (
            celery,  # noqa: F401
            checks,  # noqa: F401
        )

        contributions.register()  # the installation singleton's invariant (apps.core.registry)
