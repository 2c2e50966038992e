"""Thin Celery wrapper for the load balancer's housekeeping."""

from __future__ import annotations

from celery import shared_task

from apps.gateway import lbstate


# The name predates the gateway app (the beat schedule and queued messages use it): kept as it was.
@shared_task(name="clusters.clear_settled_churn")
def clear_settled_churn() -> int:
    return lbstate.clear_settled_churn()
