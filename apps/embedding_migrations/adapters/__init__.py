"""The vector-store adapters, by kind (``VectorStoreAdapter.kind``)."""

from __future__ import annotations

from .base import UNKNOWN_ADAPTER, AdapterError, VectorStoreAdapter
from .pgvector import PgvectorAdapter

ADAPTERS: dict[str, type[VectorStoreAdapter]] = {PgvectorAdapter.kind: PgvectorAdapter}


def adapter_for(kind: str, dsn: str) -> VectorStoreAdapter:
    """An adapter of ``kind`` on the store at ``dsn`` (``UNKNOWN_ADAPTER`` for a kind without one)."""
    try:
        adapter_class = ADAPTERS[kind]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise AdapterError(
            UNKNOWN_ADAPTER, f"no adapter for stores of kind {kind!r} (known: {known})."
        ) from None
    return adapter_class(dsn)
