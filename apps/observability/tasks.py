"""The worker's side of observability: telemetry sampling (apps/observability/sampling.py)."""

from __future__ import annotations

from celery import shared_task

from apps.observability import sampling


@shared_task(name="observability.sample")
def sample_telemetry() -> dict[str, int]:
    return sampling.sample()
