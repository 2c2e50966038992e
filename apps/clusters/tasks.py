"""Thin Celery wrapper for the capability health check."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="clusters.check_capabilities")
def check_capabilities() -> list[str]:
    """CAPABILITY_UNSERVED raised and cleared from the bindings the gateway routes by."""
    from apps.clusters import health

    return health.check_capabilities()
