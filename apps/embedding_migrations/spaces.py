"""Embedding spaces: what a capability's vectors are made in, measured on a running backend or declared,
and the REQUIRES_REINDEX refusal that names two spaces."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone

from apps.clusters.models import Capability
from apps.embedding_migrations import codes
from apps.embedding_migrations.choices import FINAL_STAGES, Pooling
from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace
from apps.servers.models import ModelServer
from modelforge.errors import ApiError
from modelforge.errors import codes as error_codes

logger = logging.getLogger(__name__)


PROBE_TEXTS = ["modelforge embedding space probe", "a second, different probe text"]


# Names the control plane's own measuring request to a backend (not a client's, never through the gateway).
PROBE_HEADER = "X-ModelForge-Probe"


def space_of(capability: Capability) -> EmbeddingSpace | None:
    """The recorded space of ``capability`` (of the one it follows, for an alias's query name)."""
    target = capability.follows if capability.follows_id else capability
    assert target is not None
    return EmbeddingSpace.objects.filter(capability=target).first()


def _running_backend(capability: Capability) -> tuple[ModelServer, str]:
    from apps.clusters.bindings import read_bindings

    bindings, _follows = read_bindings()
    for binding in sorted(bindings.get(capability.name, []), key=lambda b: b.tier):
        for backend in binding.backends:
            return ModelServer.objects.select_related("artifact").get(pk=backend.key), backend.url
    raise ApiError(
        codes.EMBEDDING_SPACE_UNKNOWN,
        f"{capability.name} has no running backend to measure its embedding space: bind it to a running "
        "server, or declare the space (POST /api/v1/embedding-spaces).",
        409,
    )


def measure_space(capability: Capability, *, actor: str, pooling: str = Pooling.UNKNOWN) -> EmbeddingSpace:
    """Record ``capability``'s space: model and revision from its server, dimension and normalisation
    measured by embedding two probe texts on a running backend."""
    if capability.follows_id:
        raise ApiError(
            error_codes.VALIDATION_ERROR,
            f"{capability.name} follows {capability.follows}: its space is that capability's.",
            400,
        )
    server, url = _running_backend(capability)
    try:
        answer = httpx.post(
            f"{url}/v1/embeddings",
            json={"model": capability.name, "input": PROBE_TEXTS},
            headers={PROBE_HEADER: "embedding-space"},
            timeout=60,  # a large model's first embedding on a busy CPU node can take seconds
        )
        answer.raise_for_status()
        vectors = [item["embedding"] for item in answer.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ApiError(
            codes.EMBEDDING_SPACE_UNKNOWN,
            f"{capability.name}'s backend {server.name} did not answer an embeddings request "
            f"({type(exc).__name__}); is it an embedding model?",
            409,
        ) from None
    if not vectors or not all(is_vector(v) for v in vectors):
        raise ApiError(
            codes.EMBEDDING_SPACE_UNKNOWN,
            f"{capability.name}'s backend {server.name} did not answer one flat vector of numbers per input "
            "(a model served without pooling answers a vector per token): serve it with a pooling.",
            409,
        )
    dimension = len(vectors[0])
    if any(len(v) != dimension for v in vectors):
        raise ApiError(
            codes.EMBEDDING_SPACE_UNKNOWN,
            f"{capability.name}'s backend {server.name} answered vectors of mixed dimensions.",
            409,
        )
    normalized = all(abs(norm(v) - 1.0) < 1e-3 for v in vectors)
    revision = server.artifact.revision if server.artifact_id and server.artifact else ""
    return record_space(
        capability,
        {
            "model": server.model,
            "revision": revision,
            "dimension": dimension,
            "normalized": normalized,
            "pooling": pooling,
        },
        actor=f"probe by {actor}",
    )


def record_space(capability: Capability, identity: dict[str, Any], *, actor: str) -> EmbeddingSpace:
    """Record (or change) a capability's space. Changing it under an alias's data is refused."""
    with transaction.atomic():
        current = EmbeddingSpace.objects.select_for_update().filter(capability=capability).first()
        if current is not None:
            changed = any(getattr(current, k) != v for k, v in identity.items())
            holders = ConsumerAlias.objects.filter(capability=capability)
            moving = Cutover.objects.filter(target_capability=capability).exclude(stage__in=FINAL_STAGES)
            if changed and moving.exists():
                raise ApiError(
                    codes.CUTOVER_IN_PROGRESS,
                    f"{capability.name} is the target of cutover {moving.first().pk}: its space "  # type: ignore[union-attr]
                    f"({current.key}) is what that cutover reindexes into. Roll it back first.",
                    409,
                )
            if changed and holders.exists():
                proposed = EmbeddingSpace(capability=capability, **identity)
                raise ApiError(
                    codes.REQUIRES_REINDEX,
                    f"{capability.name} holds data behind alias "
                    f"{', '.join(str(a) for a in holders)} in space {current.describe()} ({current.key}); "
                    f"recording {proposed.describe()} ({proposed.key}) would put that data under another "
                    "space. Bind a new capability version and cut the alias over to it.",
                    409,
                )
        space, _ = EmbeddingSpace.objects.update_or_create(
            capability=capability, defaults={**identity, "recorded_at": timezone.now(), "recorded_by": actor}
        )
    return space


def reindex_refusal(source: EmbeddingSpace, target: EmbeddingSpace, what: str) -> ApiError:
    return ApiError(
        codes.REQUIRES_REINDEX,
        f"{what}: the data is in space {source.describe()} ({source.key}), the target is "
        f"{target.describe()} ({target.key}). Vectors of different spaces are not comparable: reindex into "
        "the target space and verify it first (start the cutover, then cut over when it is ready_to_cut).",
        409,
    )


def norm(vector: Sequence[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def is_vector(value: Any) -> bool:
    """A non-empty flat list of numbers (not a vector per token, not booleans)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
    )
