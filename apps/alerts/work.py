"""``WORK_STUCK``: raised for each row the work watchdog finds past its bound (``apps.core.work``), cleared
when the row moves on or an operator marks it failed. Connected at ``AlertsConfig.ready()``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.dispatch import receiver
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.core import work
from apps.core.work import WORK_STUCK


@receiver(work.watched, dispatch_uid="alerts.work_stuck")
def raise_and_clear_work_stuck(stuck: list[work.Waiting], now: datetime, **_: Any) -> None:
    for item in stuck:
        Alert.objects.raise_alert(
            WORK_STUCK,
            Severity.WARNING,
            item.kind,
            item.id,
            item.name,
            f"{item.name[:1].upper()}{item.name[1:]} has been {item.state} since "
            f"{timezone.localtime(item.since):%Y-%m-%d %H:%M:%S %Z}, waiting for {item.waits_on} "
            f"(bound {item.stuck_after} s). Its task is re-sent while it waits; retry it or mark it failed "
            f"(dashboard Work, the admin, or POST /api/v1/system/work/{item.kind}/{item.id}/retry|fail).",
            at=now,
        )
    keep = {(item.kind, item.id) for item in stuck}
    cleared = [
        alert.dedup_key
        for alert in Alert.objects.open().filter(code=WORK_STUCK)
        if (alert.subject_type, alert.subject_id) not in keep
    ]
    Alert.objects.clear(cleared, at=now)


@receiver(work.marked_failed, dispatch_uid="alerts.work_failed")
def clear_work_stuck(kind: str, pk: str, **_: Any) -> None:
    Alert.objects.clear_for([WORK_STUCK], kind, pk)
