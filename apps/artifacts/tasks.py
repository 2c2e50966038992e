"""Thin Celery wrappers over artifact acquisition."""

from __future__ import annotations

from celery import shared_task

from apps.artifacts import acquisition
from apps.artifacts.models import Artifact, ArtifactState


@shared_task(name="artifacts.acquire")
def acquire(artifact_id: int) -> str:
    artifact = Artifact.objects.filter(pk=artifact_id).first()
    if artifact is None or artifact.state not in (ArtifactState.REQUESTED, ArtifactState.FAILED):
        return "skipped"
    acquisition.acquire(artifact)
    return artifact.state
