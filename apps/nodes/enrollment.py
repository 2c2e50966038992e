"""Trading a single-use enrollment token for a node identity and credential."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.nodes import codes
from apps.nodes.choices import EventKind
from apps.nodes.models import CREDENTIAL_PREFIX, EnrollmentToken, Node, NodeEvent, digest
from modelforge.errors import ApiError


@dataclass
class Enrollment:
    node: Node
    credential: str


def _refusal(token: EnrollmentToken | None) -> ApiError:
    """Why a token could not be redeemed, by name."""
    if token is None:
        return ApiError(
            codes.ENROLLMENT_TOKEN_UNKNOWN,
            "This enrollment token is not known; mint a new one (dashboard, admin or API) and use it once.",
            401,
        )
    if token.used_at:
        return ApiError(
            codes.ENROLLMENT_TOKEN_USED,
            "This enrollment token was already used; tokens are single use. If this agent enrolled before, "
            "its identity file is missing: check MODELFORGE_AGENT_STATE_VOLUME is durable storage.",
            409,
        )
    if token.revoked_at:
        return ApiError(
            codes.ENROLLMENT_TOKEN_REVOKED, "This enrollment token was revoked; mint a new one.", 401
        )
    return ApiError(codes.ENROLLMENT_TOKEN_EXPIRED, "This enrollment token has expired; mint a new one.", 401)


def enroll(*, token: str, name: str, accelerator: str, agent_version: str, agent_url: str) -> Enrollment:
    """Redeem ``token`` and create the node, atomically.

    1. Claim the token with one compare-and-swap UPDATE: of two concurrent redemptions exactly one
       matches the row (the other waits on its lock, then finds ``used_at`` set).
    2. Create the node with a fresh credential; a name already taken is refused, which rolls the
       claim back, so the token stays usable for a corrected retry.
    """
    now = timezone.now()
    token_hash = digest(token)
    with transaction.atomic():
        claimed = EnrollmentToken.objects.filter(
            token_hash=token_hash, used_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
        if not claimed:
            raise _refusal(EnrollmentToken.objects.filter(token_hash=token_hash).first())
        credential = CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
        try:
            with transaction.atomic():
                node = Node.objects.create(
                    name=name,
                    accelerator=accelerator,
                    agent_version=agent_version,
                    agent_url=agent_url,
                    credential_hash=digest(credential),
                    enrolled_at=now,
                )
        except IntegrityError:
            raise ApiError(
                codes.NODE_NAME_TAKEN,
                f"A node named {name!r} is already enrolled. If this is the same machine, its identity file "
                "was lost: restore MODELFORGE_AGENT_STATE_VOLUME (or delete the old node first); otherwise "
                "set MODELFORGE_AGENT_NAME to a different name.",
                409,
            ) from None
        EnrollmentToken.objects.filter(token_hash=token_hash).update(node=node)
        NodeEvent.objects.create(node=node, kind=EventKind.ENROLLED, at=now, detail=f"agent {agent_version}")
    return Enrollment(node=node, credential=credential)
