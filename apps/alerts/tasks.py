"""The worker's side of alerts: notification delivery (apps/alerts/notify.py)."""

from __future__ import annotations

from celery import shared_task

from apps.alerts import notify


@shared_task(name="alerts.notify")
def notify_alerts() -> dict[str, int]:
    return notify.worker_pass()
