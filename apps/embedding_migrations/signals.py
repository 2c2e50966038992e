"""A capability's space is recorded when it is bound, and travels with the gateway's answers: its
changes move the routing version."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from apps.clusters.models import RoutingTier
from apps.embedding_migrations.models import EmbeddingSpace


@receiver(post_save, sender=EmbeddingSpace)
@receiver(post_delete, sender=EmbeddingSpace)
def _space_changed(sender: Any, **kwargs: Any) -> None:
    from apps.clusters.bindings import bump_version

    bump_version()


@receiver(post_save, sender=RoutingTier)
def _capability_bound(sender: Any, instance: RoutingTier, created: bool = False, **kwargs: Any) -> None:
    """A capability's space is recorded when it is bound (measured on its backend once one runs)."""
    if not created:
        return
    from apps.embedding_migrations.tasks import record_space
    from modelforge.dispatch import send_on_commit

    if not EmbeddingSpace.objects.filter(capability_id=instance.capability_id).exists():
        send_on_commit(record_space, instance.capability_id)
