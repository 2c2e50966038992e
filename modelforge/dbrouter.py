"""Database routing: monitoring history (``apps.observability``) on its own alias, everything else on
``default``.

With ``MODELFORGE_OBSERVABILITY_DATABASE_URL`` unset, the ``observability`` alias is a second connection
to the default database, and its tables migrate with everything else. Set, it is another database:
``manage.py migrate --database observability`` creates its tables there, and when it fails, only
monitoring does (``OBSERVABILITY_DEGRADED``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

OBSERVABILITY = "observability"


class ObservabilityRouter:
    def db_for_read(self, model: type, **hints: Any) -> str | None:
        return OBSERVABILITY if model._meta.app_label == OBSERVABILITY else None  # type: ignore[attr-defined]

    db_for_write = db_for_read

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        labels = {obj1._meta.app_label == OBSERVABILITY, obj2._meta.app_label == OBSERVABILITY}
        return None if len(labels) == 1 else False

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        shared = settings.OBSERVABILITY_SHARES_DEFAULT
        if app_label == OBSERVABILITY:
            return db == ("default" if shared else OBSERVABILITY)
        return db == "default"
