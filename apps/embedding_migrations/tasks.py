"""Celery tasks of embedding migrations: a stage run, and the watch for silent runs."""

from __future__ import annotations

from celery import shared_task

from apps.embedding_migrations import engine


@shared_task(name="embedding_migrations.run_cutover")
def run_cutover(cutover_id: str, token: str) -> str:
    """Run a cutover's stage (claimed by ``token``); a second delivery of the same run does nothing."""
    return engine.run(cutover_id, token)


@shared_task(name="embedding_migrations.watch")
def watch() -> dict[str, int]:
    return engine.watch()
