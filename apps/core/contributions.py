"""The platform's own contribution to the registries (``apps.core.registry``): the installation singleton."""

from __future__ import annotations

from apps.core import registry
from apps.core.registry import Invariant


def register() -> None:
    registry.invariants.register(
        Invariant(
            "one_installation",
            "at most one installation row (the singleton)",
            "SELECT greatest(count(*) - 1, 0) FROM core_installation",
        )
    )
