"""The operator's rules about artifacts, each written once: the API, the dashboard and the admin call
these and answer with their refusals (``ApiError``) as they are.

Release and amend of a quarantined artifact are ``apps.artifacts.acquisition.release`` / ``amend``
(they re-run the supply-chain checks, which live there); this module holds the rules that decide
whether work is sent at all.
"""

from __future__ import annotations

import logging

from apps.artifacts import acquisition, codes
from apps.artifacts.models import Artifact, ArtifactState
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)


def reacquisition_blocked(artifact: Artifact) -> bool:
    """A rehydration found the upstream changed: acquiring again would record whatever the upstream holds
    now under the old identity (the acquire task refuses it too, for a message sent before)."""
    return artifact.failure_code == codes.ARTIFACT_REHYDRATION_BLOCKED


def retry_refusal(artifact: Artifact) -> ApiError | None:
    """Why ``artifact``'s acquisition may not be retried now, or None when it may."""
    if artifact.state != ArtifactState.FAILED:
        return ApiError(
            codes.ARTIFACT_NOT_FAILED,
            f"Only a failed acquisition is retried; artifact {artifact.name} is {artifact.state}.",
            409,
        )
    if reacquisition_blocked(artifact):
        return ApiError(
            codes.ARTIFACT_REHYDRATION_BLOCKED,
            "Acquiring again would record what the upstream holds now under the old identity; "
            "register a new artifact instead.",
            409,
        )
    return None


def retry_acquisition(artifact: Artifact, *, by: str) -> Artifact:
    """Acquire a failed artifact again from its recorded upstream, or refuse up front (409): not failed
    (``ARTIFACT_NOT_FAILED``) or its rehydration was blocked (``ARTIFACT_REHYDRATION_BLOCKED``). The
    acquisition itself runs in a worker."""
    from apps.artifacts.tasks import acquire

    refusal = retry_refusal(artifact)
    if refusal is not None:
        raise refusal
    send_on_commit(acquire, artifact.pk)
    logger.info("artifact %s: acquisition retried by %s", artifact.name, by)
    return artifact


def request_rehydration(artifact: Artifact, *, by: str) -> Artifact:
    """Re-acquire the store's copy from the recorded upstream, or refuse up front with what
    ``acquisition.rehydrate`` would refuse (no recorded files: ``ARTIFACT_HAS_NO_FILES``; quarantined:
    ``ARTIFACT_QUARANTINED``). The worker checks again, for a state that changed after this answer."""
    from apps.artifacts.tasks import rehydrate

    refusal = acquisition.rehydration_refusal(artifact)
    if refusal is not None:
        raise refusal
    send_on_commit(rehydrate, artifact.pk)
    logger.info("artifact %s: rehydration requested by %s", artifact.name, by)
    return artifact
