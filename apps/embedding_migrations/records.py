"""A cutover's records: transitions with who and why, and the control plane's half of a swap."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.alerts.models import Alert
from apps.clusters.models import Capability
from apps.embedding_migrations import codes
from apps.embedding_migrations.adapters.base import AdapterError
from apps.embedding_migrations.choices import Stage
from apps.embedding_migrations.models import ConsumerAlias, Cutover, CutoverEvent
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)


SUBJECT = "cutover"


class LostRun(Exception):
    """The run was taken back (rolled back, retried, marked interrupted): stop touching the store."""


def record_event(
    cutover: Cutover,
    from_stage: str,
    to_stage: str,
    actor: str,
    reason: str,
    detail: dict[str, Any] | None = None,
) -> None:
    CutoverEvent.objects.create(
        cutover=cutover,
        from_stage=from_stage,
        to_stage=to_stage,
        actor=actor,
        reason=reason,
        detail=detail or {},
    )


def move(cutover: Cutover, to: str, *, actor: str, reason: str, **fields: Any) -> None:
    """Record a transition of a cutover locked by the caller."""
    before = cutover.stage
    cutover.stage = to
    cutover.stage_since = timezone.now()
    for key, value in fields.items():
        setattr(cutover, key, value)
    cutover.save()
    record_event(
        cutover, before, to, actor, reason, {k: str(v) for k, v in fields.items() if k != "verification"}
    )
    if to not in (Stage.FAILED,):
        Alert.objects.clear_for([codes.CUTOVER_FAILED], SUBJECT, str(cutover.pk))
    if cutover.interrupted_at is None:
        Alert.objects.clear_for([codes.CUTOVER_INTERRUPTED], SUBJECT, str(cutover.pk))


def lock_cutover(cutover_id: Any) -> Cutover:
    return Cutover.objects.select_for_update().select_related("alias__store").get(pk=cutover_id)


def switch_books(cutover: Cutover, capability: Capability, index: str) -> None:
    """The control plane's half of a swap: the alias's recorded index and space, and its query name."""
    alias = ConsumerAlias.objects.select_for_update().get(pk=cutover.alias_id)
    alias.index, alias.capability = index, capability
    alias.save(update_fields=["index", "capability"])
    Capability.objects.filter(pk=alias.query_capability_id).update(follows=capability)
    from apps.clusters.bindings import bump_version

    transaction.on_commit(bump_version)


def store_refusal(exc: AdapterError) -> ApiError:
    status = 503 if exc.code == codes.STORE_UNAVAILABLE else 409
    return ApiError(exc.code, exc.message, status)
