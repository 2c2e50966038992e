"""What backups contribute to the platform's registries: a verified backup records its files and
snapshot time (an invariant). Registered by ``BackupsConfig.ready()``."""

from __future__ import annotations

from apps.core import registry
from apps.core.registry import Invariant


def register() -> None:
    registry.invariants.register(
        Invariant(
            "verified_backups_have_files",
            "every verified backup records its files and snapshot time",
            "SELECT count(*) FROM backups_backup WHERE state = 'verified' "
            "AND (jsonb_array_length(files) = 0 OR consistent_as_of IS NULL)",
        )
    )
