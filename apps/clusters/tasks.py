"""Thin Celery wrappers for the load balancer's housekeeping."""

from __future__ import annotations

from celery import shared_task

from apps.clusters import lbstate


@shared_task(name="clusters.clear_settled_churn")
def clear_settled_churn() -> int:
    return lbstate.clear_settled_churn()


@shared_task(name="clusters.check_capabilities")
def check_capabilities() -> list[str]:
    """CAPABILITY_UNSERVED raised and cleared from the gateway's own routing table."""
    from apps.clusters import health

    return health.check_capabilities()
