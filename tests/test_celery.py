"""Celery: configuration, the beat schedule, and one task end to end through a real worker and Redis."""

from __future__ import annotations

import pytest
from django.conf import settings

from apps.core.models import Installation
from modelforge.celery import app
from tests.fixtures import wait_until


def test_tasks_are_acknowledged_late_one_at_a_time():
    assert app.conf.task_acks_late is True
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.task_reject_on_worker_lost is True


def test_every_beat_entry_names_a_registered_task():
    app.loader.import_default_modules()
    assert settings.CELERY_BEAT_SCHEDULE
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert entry["task"] in app.tasks, f"beat entry {name!r} names unknown task {entry['task']!r}"


@pytest.mark.stack
@pytest.mark.django_db(transaction=True)
def test_a_probe_enqueued_through_the_api_is_run_by_a_real_worker(celery_worker_process, operator_client):
    # Web processes probe the worker in the background too (apps.alerts.outages): start from no stamp, and
    # prove this probe ran by its correlation id in the worker's log below.
    Installation.objects.current()
    Installation.objects.update(worker_seen_at=None)
    response = operator_client.post("/api/v1/system/worker-probe", HTTP_X_CORRELATION_ID="probe-corr-4242")
    assert response.status_code == 202
    task_id = response.json()["task_id"]
    assert task_id

    def stamped() -> bool:
        return Installation.objects.filter(worker_seen_at__isnull=False).exists()

    assert wait_until(stamped, 30), celery_worker_process.log()[-3000:]
    installation = Installation.objects.get()
    assert installation.worker_seen_hostname
    status = operator_client.get("/api/v1/system/status").json()
    assert status["worker_seen_at"] is not None
    # The worker logged the task under the correlation id of the request that enqueued it.
    assert wait_until(lambda: "ran the probe" in celery_worker_process.log(), 10)
    task_lines = [line for line in celery_worker_process.log().splitlines() if "ran the probe" in line]
    assert any("[probe-corr-4242] apps.core.tasks:" in line for line in task_lines), task_lines
