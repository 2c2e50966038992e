"""The declared interface of a vector store, as the migration engine sees it.

One class per kind of store. An adapter is the only code that touches the store: the engine plans,
records and decides; the adapter creates, writes, counts, reads and swaps. Every adapter passes the
contract suite in ``apps/embedding_migrations/tests/test_adapter_contract.py``.

Vocabulary: an **index** is one version of a consumer's vectors (one embedding space, one dimension);
the **alias** is the stable name the consumer searches, pointing at exactly one index. An index records
the space its vectors were made in (``space``: the capability's space key), so what the store holds can
be read back from the store itself, never inferred.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class AdapterError(Exception):
    """The store refused or failed; ``code`` names why (the engine records it on the cutover)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


# Codes an adapter raises.
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"  # cannot connect / the store failed mid-operation
INDEX_NOT_FOUND = "INDEX_NOT_FOUND"
INDEX_EXISTS = "INDEX_EXISTS"  # create_target over an index of another dimension or space
ALIAS_MOVED = "ALIAS_MOVED"  # swap_alias's expected target is not the alias's target now
INDEX_IN_USE = "INDEX_IN_USE"  # drop of the index an alias points at
DIMENSION_MISMATCH = "DIMENSION_MISMATCH"  # a vector of another dimension than the index's
INVALID_NAME = "INVALID_NAME"
INVALID_VALUE = "INVALID_VALUE"  # a value the store cannot hold (NaN, NUL in text, too many dimensions)
UNKNOWN_ADAPTER = "UNKNOWN_ADAPTER"  # no adapter for the kind of store asked for


@dataclass(frozen=True)
class Document:
    id: str
    content: str


@dataclass(frozen=True)
class Row:
    id: str
    content: str
    embedding: list[float]


@dataclass(frozen=True)
class IndexInfo:
    name: str
    space: str
    dimension: int
    count: int


@dataclass(frozen=True)
class Hit:
    id: str
    content: str
    distance: float
    space: str


def check_name(kind: str, name: str) -> str:
    if not NAME.match(name):
        raise AdapterError(
            INVALID_NAME,
            f"{kind} name {name!r}: use lower-case letters, digits and _, starting with a letter.",
        )
    return name


class VectorStoreAdapter(ABC):
    """A vector store behind one connection string (``dsn``)."""

    kind: ClassVar[str]
    label: ClassVar[str]

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def close(self) -> None:  # noqa: B027 - optional: an adapter may hold nothing open
        """Release what the adapter holds open (connections); it stays usable and reopens on demand."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abstractmethod
    def ping(self) -> None:
        """Raise ``STORE_UNAVAILABLE`` unless the store answers and can hold vectors."""

    @abstractmethod
    def create_target(self, index: str, *, dimension: int, space: str) -> None:
        """Create an empty index for vectors of ``dimension`` made in ``space`` (with its search index).
        Idempotent for the same dimension and space; ``INDEX_EXISTS`` for another."""

    @abstractmethod
    def write_vectors(self, index: str, rows: Sequence[Row]) -> int:
        """Upsert ``rows`` by id in one transaction (all or none); returns how many were written.
        ``DIMENSION_MISMATCH`` for a vector of another dimension; ``INDEX_NOT_FOUND``."""

    @abstractmethod
    def count(self, index: str) -> int:
        """How many rows ``index`` holds (``INDEX_NOT_FOUND``)."""

    @abstractmethod
    def info(self, index: str) -> IndexInfo:
        """The index's recorded space and dimension, and its count (``INDEX_NOT_FOUND``)."""

    @abstractmethod
    def exists(self, index: str) -> bool:
        """Whether ``index`` exists."""

    @abstractmethod
    def read_documents(self, index: str, *, after: str | None, limit: int) -> list[Document]:
        """Up to ``limit`` documents of ``index`` in id order, strictly after ``after`` (keyset paging)."""

    @abstractmethod
    def sample(self, index: str, *, n: int, seed: int) -> list[Row]:
        """``n`` rows chosen deterministically by ``seed`` (the same seed, the same rows), with vectors."""

    @abstractmethod
    def read_vectors(self, index: str, ids: Sequence[str]) -> dict[str, list[float]]:
        """The stored vectors of ``ids`` (missing ids are absent from the answer)."""

    @abstractmethod
    def read_alias_target(self, alias: str) -> str | None:
        """The index ``alias`` points at now, read from the store; None when the alias does not exist."""

    @abstractmethod
    def swap_alias(self, alias: str, index: str, *, expected: str | None) -> None:
        """Point ``alias`` at ``index`` in one transaction. ``expected`` is the target the caller believes
        the alias has (None: the alias must not exist yet); ``ALIAS_MOVED`` when it has another, and
        nothing changes. A search running during the swap sees the old target or the new, never neither."""

    @abstractmethod
    def drop_alias(self, alias: str) -> None:
        """Remove ``alias`` (never the index behind it); a missing alias is a no-op."""

    @abstractmethod
    def drop(self, index: str) -> None:
        """Drop ``index``; ``INDEX_IN_USE`` while an alias points at it.
        Dropping a missing index is a no-op."""

    @abstractmethod
    def search(self, alias: str, vector: Sequence[float], *, space: str, k: int) -> list[Hit]:
        """The ``k`` nearest rows behind ``alias`` to ``vector`` — only when the alias holds vectors of
        ``space``: a query made in another space gets no rows (never a comparison across spaces)."""

    @abstractmethod
    def list_indexes(self) -> list[IndexInfo]:
        """Every index this adapter created in the store."""
