"""What clusters contribute to the platform's registries: credentials stored hashed (an invariant over
client credentials, and the node credentials below it). Registered by ``ClustersConfig.ready()``."""

from __future__ import annotations

from apps.core import registry
from apps.core.registry import Invariant


def register() -> None:
    registry.invariants.register(
        Invariant(
            "credentials_hashed",
            "every client credential and node credential is stored as a 64-hex digest",
            "SELECT (SELECT count(*) FROM clusters_clientcredential WHERE secret_hash !~ '^[0-9a-f]{64}$') "
            "+ (SELECT count(*) FROM nodes_node WHERE credential_hash !~ '^[0-9a-f]{64}$')",
        )
    )
