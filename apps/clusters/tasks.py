"""Thin Celery wrappers for the load balancer's housekeeping."""

from __future__ import annotations

from celery import shared_task

from apps.clusters import lbstate


@shared_task(name="clusters.clear_settled_churn")
def clear_settled_churn() -> int:
    return lbstate.clear_settled_churn()
