"""A recorded space travels with the gateway's answers: its changes move the routing version."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from apps.embedding_migrations.models import EmbeddingSpace


@receiver(post_save, sender=EmbeddingSpace)
@receiver(post_delete, sender=EmbeddingSpace)
def _space_changed(sender: Any, **kwargs: Any) -> None:
    from apps.clusters.routing import bump_version

    bump_version()
