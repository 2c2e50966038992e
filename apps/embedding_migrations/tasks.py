"""Celery tasks of embedding migrations: a stage run, and the watch for silent runs."""

from __future__ import annotations

from celery import shared_task

from apps.embedding_migrations import engine, runner, spaces


@shared_task(name="embedding_migrations.run_cutover")
def run_cutover(cutover_id: str, token: str) -> str:
    """Run a cutover's stage (claimed by ``token``); a second delivery of the same run does nothing."""
    return runner.run(cutover_id, token)


@shared_task(name="embedding_migrations.watch")
def watch() -> dict[str, int]:
    return engine.watch()


# While a capability's first server is still starting, its space is measured again a little later.
MEASURE_TRIES, MEASURE_PAUSE_S = 12, 10


@shared_task(name="embedding_migrations.record_space")
def record_space(capability_id: int, attempt: int = 1) -> str:
    """Record a newly bound capability's space from a running backend, once; a capability that is not an
    embedding model (a chat model's backend refuses the probe) is left without one."""
    from apps.clusters.models import Capability
    from apps.embedding_migrations.models import EmbeddingSpace
    from modelforge.dispatch import send
    from modelforge.errors import ApiError

    capability = Capability.objects.filter(pk=capability_id, follows__isnull=True).first()
    if capability is None or EmbeddingSpace.objects.filter(capability=capability).exists():
        return "nothing to record"
    try:
        spaces.measure_space(capability, actor="binding")
    except ApiError as exc:
        if "no running backend" in exc.message and attempt < MEASURE_TRIES:
            send(record_space, capability_id, attempt + 1, countdown=MEASURE_PAUSE_S)
            return "waiting for a running backend"
        return f"not recorded: {exc.message}"
    return "recorded"
