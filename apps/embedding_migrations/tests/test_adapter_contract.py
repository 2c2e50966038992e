"""The contract every vector-store adapter passes, run against a real, fresh store of each kind.

``STORES`` says how to make a scratch store of each kind in ``ADAPTERS`` and how to sever every connection
to it (what a restart of the store does). The tests at the end are pgvector's own: its layout and catalogue.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from apps.embedding_migrations.adapters import ADAPTERS, adapter_for
from apps.embedding_migrations.adapters.base import (
    ALIAS_MOVED,
    DIMENSION_MISMATCH,
    INDEX_EXISTS,
    INDEX_IN_USE,
    INDEX_NOT_FOUND,
    INVALID_NAME,
    INVALID_VALUE,
    STORE_UNAVAILABLE,
    UNKNOWN_ADAPTER,
    AdapterError,
    Document,
    IndexInfo,
    Row,
    VectorStoreAdapter,
)
from apps.embedding_migrations.adapters.pgvector import PgvectorAdapter, parse_vector, vector_literal

from .stores import scratch_vector_dsn, sever_vector_connections


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ScratchStore:
    make: Callable[[], AbstractContextManager[str]]
    sever: Callable[[str], object]
    unreachable: Callable[[], str]


STORES: dict[str, ScratchStore] = {
    "pgvector": ScratchStore(
        make=scratch_vector_dsn,
        sever=sever_vector_connections,
        unreachable=lambda: f"postgresql://postgres@127.0.0.1:{_closed_port()}/nowhere",
    ),
}


@dataclass
class Store:
    kind: str
    dsn: str
    adapter: VectorStoreAdapter


@pytest.fixture(params=sorted(ADAPTERS))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh adapter on a fresh scratch store (never pinged: every method must work without it)."""
    kind = str(request.param)
    with STORES[kind].make() as dsn, adapter_for(kind, dsn) as adapter:
        yield Store(kind, dsn, adapter)


@pytest.fixture
def adapter(store: Store) -> VectorStoreAdapter:
    return store.adapter


def vec(dimension: int, *leading: float) -> list[float]:
    """A vector of ``dimension`` starting with ``leading``, the rest 0.5."""
    return [*leading, *([0.5] * (dimension - len(leading)))]


def rows(n: int, dimension: int, prefix: str = "doc") -> list[Row]:
    return [Row(f"{prefix}{i:03d}", f"content {i}", vec(dimension, float(i + 1))) for i in range(n)]


class _Refused:
    """``with _Refused(CODE):`` passes only when the block raises an ``AdapterError`` of ``CODE``."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.error: AdapterError | None = None

    def __enter__(self) -> _Refused:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        assert isinstance(exc, AdapterError), f"expected AdapterError({self.code}), got {exc!r}"
        assert exc.code == self.code, f"expected {self.code}, got {exc.code}: {exc.message}"
        self.error = exc
        return True


def close_to(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(a, b, strict=True)
    )


# Registry


def test_every_adapter_has_a_scratch_store() -> None:
    assert set(STORES) == set(ADAPTERS)
    for kind, adapter_class in ADAPTERS.items():
        assert adapter_class.kind == kind
        assert adapter_class.label


def test_adapter_for_builds_the_kind_and_refuses_an_unknown_one() -> None:
    adapter = adapter_for("pgvector", "postgresql://postgres@127.0.0.1:1/x")
    assert isinstance(adapter, PgvectorAdapter)
    assert adapter.dsn == "postgresql://postgres@127.0.0.1:1/x"
    with _Refused(UNKNOWN_ADAPTER) as refusal:
        adapter_for("faiss", "whatever")
    assert refusal.error is not None and "faiss" in refusal.error.message


# A fresh store


def test_ping_prepares_the_store_and_is_repeatable(adapter: VectorStoreAdapter) -> None:
    adapter.ping()
    adapter.ping()
    assert adapter.list_indexes() == []


def test_a_fresh_store_holds_nothing(adapter: VectorStoreAdapter) -> None:
    assert adapter.list_indexes() == []
    assert adapter.exists("missing") is False
    assert adapter.read_alias_target("live") is None
    adapter.drop("missing")
    adapter.drop_alias("live")
    for call in (
        lambda: adapter.count("missing"),
        lambda: adapter.info("missing"),
        lambda: adapter.read_documents("missing", after=None, limit=10),
        lambda: adapter.sample("missing", n=3, seed=1),
        lambda: adapter.read_vectors("missing", ["a"]),
        lambda: adapter.write_vectors("missing", rows(1, 4)),
        lambda: adapter.search("live", vec(4), space="s", k=3),
        lambda: adapter.swap_alias("live", "missing", expected=None),
    ):
        with _Refused(INDEX_NOT_FOUND):
            call()


@pytest.mark.parametrize("name", ["Upper", "1digit", "has-dash", "has space", "", "x" * 64, "semi;colon"])
def test_every_method_refuses_an_invalid_name(adapter: VectorStoreAdapter, name: str) -> None:
    for call in (
        lambda: adapter.create_target(name, dimension=4, space="s"),
        lambda: adapter.write_vectors(name, rows(1, 4)),
        lambda: adapter.count(name),
        lambda: adapter.info(name),
        lambda: adapter.exists(name),
        lambda: adapter.read_documents(name, after=None, limit=1),
        lambda: adapter.sample(name, n=1, seed=1),
        lambda: adapter.read_vectors(name, ["a"]),
        lambda: adapter.read_alias_target(name),
        lambda: adapter.swap_alias(name, "good", expected=None),
        lambda: adapter.swap_alias("good", name, expected=None),
        lambda: adapter.drop_alias(name),
        lambda: adapter.drop(name),
        lambda: adapter.search(name, vec(4), space="s", k=1),
    ):
        with _Refused(INVALID_NAME):
            call()


# Creating


def test_create_target_is_idempotent_for_the_same_shape(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=16, space="sa")
    adapter.write_vectors("idx_a", rows(3, 16))
    adapter.create_target("idx_a", dimension=16, space="sa")
    assert adapter.exists("idx_a")
    assert adapter.info("idx_a") == IndexInfo(name="idx_a", space="sa", dimension=16, count=3)


def test_create_target_refuses_another_dimension_or_space(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=16, space="sa")
    with _Refused(INDEX_EXISTS):
        adapter.create_target("idx_a", dimension=8, space="sa")
    with _Refused(INDEX_EXISTS):
        adapter.create_target("idx_a", dimension=16, space="sb")
    assert adapter.info("idx_a") == IndexInfo(name="idx_a", space="sa", dimension=16, count=0)


def test_list_indexes_names_every_index_with_its_shape_and_count(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_b", dimension=8, space="sb")
    adapter.create_target("idx_a", dimension=16, space="sa")
    adapter.write_vectors("idx_a", rows(5, 16))
    assert sorted(adapter.list_indexes(), key=lambda i: i.name) == [
        IndexInfo(name="idx_a", space="sa", dimension=16, count=5),
        IndexInfo(name="idx_b", space="sb", dimension=8, count=0),
    ]


# Writing and reading


def test_written_rows_read_back(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    written = [
        Row("b", "bee", [0.25, -1.5, 3.0, 1e-3]),
        Row("a", "ay", [1.0, 2.0, 3.0, 4.0]),
        Row("C", "see ünïcödé", [-0.1, 0.2, -0.3, 0.4]),
    ]
    assert adapter.write_vectors("idx_a", written) == 3
    assert adapter.count("idx_a") == 3
    vectors = adapter.read_vectors("idx_a", ["a", "b", "C", "absent"])
    assert set(vectors) == {"a", "b", "C"}
    for row in written:
        assert close_to(vectors[row.id], row.embedding)
    assert adapter.read_vectors("idx_a", []) == {}
    assert adapter.read_documents("idx_a", after=None, limit=10) == [
        Document("C", "see ünïcödé"),
        Document("a", "ay"),
        Document("b", "bee"),
    ]


def test_read_documents_pages_by_id_in_python_order(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=2, space="sa")
    ids = ["b10", "b9", "B1", "a", "a_1", "a-1", "Z", "é", "e", "0", "10", "9", "aa", "ab", "A"]
    adapter.write_vectors("idx_a", [Row(i, f"text of {i}", [1.0, 2.0]) for i in ids])
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        page = adapter.read_documents("idx_a", after=after, limit=4)
        if not page:
            break
        assert len(page) <= 4
        assert all(doc.content == f"text of {doc.id}" for doc in page)
        seen.extend(doc.id for doc in page)
        after = page[-1].id
        pages += 1
    assert seen == sorted(ids)
    assert pages == 4
    assert adapter.read_documents("idx_a", after="b9", limit=10) == [
        Document("e", "text of e"),
        Document("é", "text of é"),
    ]
    assert adapter.read_documents("idx_a", after=None, limit=0) == []


def test_write_is_an_upsert_by_id(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.write_vectors("idx_a", rows(3, 4))
    assert adapter.write_vectors("idx_a", [Row("doc001", "changed", [9.0, 9.0, 9.0, 9.0])]) == 1
    assert adapter.write_vectors("idx_a", rows(3, 4)[:1]) == 1
    assert adapter.count("idx_a") == 3
    docs = {d.id: d.content for d in adapter.read_documents("idx_a", after=None, limit=10)}
    assert docs == {"doc000": "content 0", "doc001": "changed", "doc002": "content 2"}
    assert close_to(adapter.read_vectors("idx_a", ["doc001"])["doc001"], [9.0, 9.0, 9.0, 9.0])


def test_the_last_of_repeated_ids_in_one_batch_wins(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=2, space="sa")
    batch = [Row("x", "first", [1.0, 0.0]), Row("y", "only", [0.0, 1.0]), Row("x", "last", [2.0, 0.0])]
    assert adapter.write_vectors("idx_a", batch) == 2
    assert adapter.read_documents("idx_a", after=None, limit=10) == [
        Document("x", "last"),
        Document("y", "only"),
    ]
    assert close_to(adapter.read_vectors("idx_a", ["x"])["x"], [2.0, 0.0])


def test_an_empty_write_writes_nothing(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=2, space="sa")
    assert adapter.write_vectors("idx_a", []) == 0
    assert adapter.count("idx_a") == 0


def test_a_batch_with_one_wrong_dimension_writes_nothing(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=16, space="sa")
    adapter.write_vectors("idx_a", rows(2, 16))
    batch = [*rows(5, 16, prefix="new"), Row("new_bad", "bad", vec(8)), Row("doc000", "overwritten", vec(16))]
    with _Refused(DIMENSION_MISMATCH) as refusal:
        adapter.write_vectors("idx_a", batch)
    assert refusal.error is not None
    assert (
        "16" in refusal.error.message and "8" in refusal.error.message and "new_bad" in refusal.error.message
    )
    assert adapter.count("idx_a") == 2
    assert adapter.read_documents("idx_a", after=None, limit=10) == [
        Document("doc000", "content 0"),
        Document("doc001", "content 1"),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        Row("bad", "bad", [0.1, math.nan, 0.3, 0.4]),
        Row("bad", "bad", [0.1, math.inf, 0.3, 0.4]),
        Row("bad", "bad", [0.1, -math.inf, 0.3, 0.4]),
        Row("bad", "bad", [0.1, 1e39, 0.3, 0.4]),
        Row("bad", "nul \x00 inside", [0.1, 0.2, 0.3, 0.4]),
        Row("bad\x00", "bad", [0.1, 0.2, 0.3, 0.4]),
    ],
    ids=["nan", "inf", "-inf", "past-float32", "nul-in-content", "nul-in-id"],
)
def test_a_batch_with_a_value_the_store_cannot_hold_writes_nothing(
    adapter: VectorStoreAdapter, bad: Row
) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    batch = [*rows(3, 4), bad]
    with _Refused(INVALID_VALUE):
        adapter.write_vectors("idx_a", batch)
    assert adapter.count("idx_a") == 0


def test_sample_is_deterministic_by_seed(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    written = {row.id: row for row in rows(100, 4)}
    adapter.write_vectors("idx_a", list(written.values()))
    first = adapter.sample("idx_a", n=10, seed=7)
    assert len(first) == 10
    assert len({row.id for row in first}) == 10
    assert adapter.sample("idx_a", n=10, seed=7) == first
    assert [r.id for r in adapter.sample("idx_a", n=10, seed=8)] != [r.id for r in first]
    for row in first:
        assert row.content == written[row.id].content
        assert close_to(row.embedding, written[row.id].embedding)
    everything = adapter.sample("idx_a", n=500, seed=7)
    assert sorted(r.id for r in everything) == sorted(written)
    assert adapter.sample("idx_a", n=0, seed=7) == []


# Aliases


def test_swap_alias_is_a_compare_and_swap(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=16, space="sa")
    adapter.create_target("idx_b", dimension=8, space="sb")
    assert adapter.read_alias_target("live") is None

    with _Refused(ALIAS_MOVED):
        adapter.swap_alias("live", "idx_a", expected="idx_b")
    assert adapter.read_alias_target("live") is None

    adapter.swap_alias("live", "idx_a", expected=None)
    assert adapter.read_alias_target("live") == "idx_a"

    with _Refused(ALIAS_MOVED):
        adapter.swap_alias("live", "idx_b", expected=None)
    with _Refused(ALIAS_MOVED):
        adapter.swap_alias("live", "idx_b", expected="idx_b")
    assert adapter.read_alias_target("live") == "idx_a"

    adapter.swap_alias("live", "idx_b", expected="idx_a")
    assert adapter.read_alias_target("live") == "idx_b"
    adapter.swap_alias("live", "idx_b", expected="idx_b")
    assert adapter.read_alias_target("live") == "idx_b"

    with _Refused(INDEX_NOT_FOUND):
        adapter.swap_alias("live", "missing", expected="idx_b")
    assert adapter.read_alias_target("live") == "idx_b"


def test_drop_alias_leaves_the_index(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.write_vectors("idx_a", rows(3, 4))
    adapter.swap_alias("live", "idx_a", expected=None)
    adapter.drop_alias("live")
    assert adapter.read_alias_target("live") is None
    assert adapter.count("idx_a") == 3
    with _Refused(INDEX_NOT_FOUND):
        adapter.search("live", vec(4), space="sa", k=1)
    adapter.drop_alias("live")
    adapter.swap_alias("live", "idx_a", expected=None)
    assert adapter.read_alias_target("live") == "idx_a"


# Dropping


def test_drop_refuses_an_index_in_use_and_drops_it_once_free(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.create_target("idx_b", dimension=4, space="sb")
    adapter.write_vectors("idx_a", rows(3, 4))
    adapter.swap_alias("live", "idx_a", expected=None)
    with _Refused(INDEX_IN_USE) as refusal:
        adapter.drop("idx_a")
    assert refusal.error is not None and "live" in refusal.error.message
    assert adapter.info("idx_a").count == 3
    assert adapter.read_alias_target("live") == "idx_a"

    adapter.swap_alias("live", "idx_b", expected="idx_a")
    adapter.drop("idx_a")
    assert not adapter.exists("idx_a")
    assert [i.name for i in adapter.list_indexes()] == ["idx_b"]
    with _Refused(INDEX_NOT_FOUND):
        adapter.count("idx_a")
    adapter.drop("idx_a")
    adapter.create_target("idx_a", dimension=8, space="sc")
    assert adapter.info("idx_a") == IndexInfo(name="idx_a", space="sc", dimension=8, count=0)


# Searching


def test_search_answers_the_nearest_rows_of_the_alias(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=3, space="sa")
    adapter.write_vectors(
        "idx_a",
        [
            Row("east", "e", [1.0, 0.0, 0.0]),
            Row("north", "n", [0.0, 1.0, 0.0]),
            Row("up", "u", [0.0, 0.0, 1.0]),
            Row("north_east", "ne", [1.0, 1.0, 0.0]),
        ],
    )
    adapter.swap_alias("live", "idx_a", expected=None)
    hits = adapter.search("live", [1.0, 0.1, 0.0], space="sa", k=3)
    assert [h.id for h in hits] == ["east", "north_east", "north"]
    assert [h.content for h in hits] == ["e", "ne", "n"]
    assert all(h.space == "sa" for h in hits)
    assert hits[0].distance == pytest.approx(1 - 1 / math.sqrt(1.01), abs=1e-5)
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    assert adapter.search("live", [1.0, 0.1, 0.0], space="sa", k=0) == []


def test_search_answers_k_rows_past_the_default_candidate_list(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.write_vectors("idx_a", rows(120, 4))
    adapter.swap_alias("live", "idx_a", expected=None)
    hits = adapter.search("live", vec(4, 1.0), space="sa", k=100)
    assert len(hits) == 100
    assert len({h.id for h in hits}) == 100


def test_search_across_spaces_answers_nothing(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=16, space="sa")
    adapter.write_vectors("idx_a", rows(20, 16))
    adapter.swap_alias("live", "idx_a", expected=None)
    for _ in range(25):  # past any plan cache's switch to a generic plan
        assert adapter.search("live", vec(8, 1.0), space="sb", k=5) == []
        assert adapter.search("live", vec(16, 1.0), space="sb", k=5) == []
        assert adapter.search("live", vec(3000, 1.0), space="sb", k=50) == []
    assert len(adapter.search("live", vec(16, 1.0), space="sa", k=5)) == 5


def test_search_in_the_alias_space_with_another_dimension_is_refused(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=16, space="sa")
    adapter.write_vectors("idx_a", rows(3, 16))
    adapter.swap_alias("live", "idx_a", expected=None)
    with _Refused(DIMENSION_MISMATCH):
        adapter.search("live", vec(8, 1.0), space="sa", k=3)
    with _Refused(INVALID_VALUE):
        adapter.search("live", [math.nan, *vec(15)], space="sa", k=3)


def test_search_needs_an_alias(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.write_vectors("idx_a", rows(3, 4))
    with _Refused(INDEX_NOT_FOUND):
        adapter.search("live", vec(4), space="sa", k=3)
    with _Refused(INDEX_NOT_FOUND):
        adapter.search("idx_a", vec(4), space="sa", k=3)


def test_searches_during_swaps_see_the_old_target_or_the_new(adapter: VectorStoreAdapter) -> None:
    adapter.create_target("idx_a", dimension=16, space="sa")
    adapter.create_target("idx_b", dimension=8, space="sb")
    ids = {
        "sa": {r.id for r in rows(30, 16, prefix="a")},
        "sb": {r.id for r in rows(30, 8, prefix="b")},
    }
    adapter.write_vectors("idx_a", rows(30, 16, prefix="a"))
    adapter.write_vectors("idx_b", rows(30, 8, prefix="b"))
    adapter.swap_alias("live", "idx_a", expected=None)
    queries = {"sa": vec(16, 3.0), "sb": vec(8, 3.0)}

    errors: list[BaseException] = []
    answers: dict[str, list[int]] = {"sa": [], "sb": []}
    searched = [0]
    stop = threading.Event()

    def search_in_a_loop() -> None:
        while not stop.is_set():
            for space, query in queries.items():
                try:
                    hits = adapter.search("live", query, space=space, k=5)
                except BaseException as exc:
                    errors.append(exc)
                    return
                if hits and (len(hits) != 5 or any(h.space != space or h.id not in ids[space] for h in hits)):
                    errors.append(AssertionError(f"a mixed answer for {space}: {hits}"))
                answers[space].append(len(hits))
            searched[0] += 1

    searcher = threading.Thread(target=search_in_a_loop, daemon=True)
    searcher.start()
    try:
        current = "idx_a"
        for _ in range(20):
            following = "idx_b" if current == "idx_a" else "idx_a"
            adapter.swap_alias("live", following, expected=current)
            current = following
            seen = searched[0]
            deadline = time.monotonic() + 10
            while searched[0] < seen + 2 and not errors and time.monotonic() < deadline:
                time.sleep(0.002)
    finally:
        stop.set()
        searcher.join(timeout=10)
    assert errors == []
    assert adapter.read_alias_target("live") == "idx_a"
    for space in ("sa", "sb"):
        assert set(answers[space]) == {0, 5}, answers[space]


# An unreachable store, a severed connection


def test_an_unreachable_store_is_store_unavailable_quickly(store: Store) -> None:
    dsn = STORES[store.kind].unreachable()
    with adapter_for(store.kind, dsn) as adapter:
        for call in (
            adapter.ping,
            lambda: adapter.create_target("idx_a", dimension=4, space="sa"),
            lambda: adapter.write_vectors("idx_a", rows(1, 4)),
            lambda: adapter.count("idx_a"),
            lambda: adapter.info("idx_a"),
            lambda: adapter.exists("idx_a"),
            lambda: adapter.read_documents("idx_a", after=None, limit=1),
            lambda: adapter.sample("idx_a", n=1, seed=1),
            lambda: adapter.read_vectors("idx_a", ["a"]),
            lambda: adapter.read_alias_target("live"),
            lambda: adapter.swap_alias("live", "idx_a", expected=None),
            lambda: adapter.drop_alias("live"),
            lambda: adapter.drop("idx_a"),
            lambda: adapter.search("live", vec(4), space="sa", k=1),
            adapter.list_indexes,
        ):
            began = time.monotonic()
            with _Refused(STORE_UNAVAILABLE):
                call()
            assert time.monotonic() - began < 3


def test_a_severed_connection_does_not_stick(store: Store) -> None:
    adapter = store.adapter
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.write_vectors("idx_a", rows(3, 4))
    adapter.swap_alias("live", "idx_a", expected=None)
    STORES[store.kind].sever(store.dsn)
    assert adapter.count("idx_a") == 3
    STORES[store.kind].sever(store.dsn)
    assert len(adapter.search("live", vec(4, 1.0), space="sa", k=2)) == 2
    STORES[store.kind].sever(store.dsn)
    assert adapter.write_vectors("idx_a", rows(4, 4)) == 4
    assert adapter.count("idx_a") == 4


# pgvector's own


@pytest.fixture
def pg(store: Store) -> Iterator[psycopg.Connection[Any]]:
    if store.kind != "pgvector":
        pytest.skip("pgvector only")
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        yield conn


def test_pgvector_text_form_round_trips() -> None:
    assert vector_literal([1, 0.5, -2.25e-7]) == "[1.0,0.5,-2.25e-07]"
    assert parse_vector("[1,0.5,-2.25e-07]") == [1.0, 0.5, -2.25e-07]
    assert parse_vector(vector_literal([0.1, 0.2])) == [0.1, 0.2]
    for bad in ([], [math.nan], [1e39], [0.0] * 16001):
        with _Refused(INVALID_VALUE):
            vector_literal(bad)


def test_pgvector_alias_target_is_read_from_the_view(
    adapter: VectorStoreAdapter, pg: psycopg.Connection[Any]
) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.create_target("idx_b", dimension=4, space="sb")
    adapter.swap_alias("live", "idx_a", expected=None)
    assert pg.execute("SELECT alias, index FROM modelforge_aliases").fetchall() == [("live", "idx_a")]
    pg.execute("DELETE FROM modelforge_aliases")
    assert adapter.read_alias_target("live") == "idx_a"
    pg.execute(
        "DROP VIEW live; CREATE VIEW live AS SELECT id, content, embedding, 'sb'::text AS space FROM idx_b"
    )
    assert adapter.read_alias_target("live") == "idx_b"
    with _Refused(ALIAS_MOVED):
        adapter.swap_alias("live", "idx_a", expected="idx_a")
    adapter.swap_alias("live", "idx_a", expected="idx_b")
    assert pg.execute("SELECT alias, index FROM modelforge_aliases").fetchall() == [("live", "idx_a")]


def test_pgvector_search_index_is_built_when_an_alias_first_points_at_the_index(
    adapter: VectorStoreAdapter, pg: psycopg.Connection[Any]
) -> None:
    def hnsw_indexes(table: str) -> list[str]:
        return [
            str(r[0])
            for r in pg.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE '%%USING hnsw%%'",
                [table],
            )
        ]

    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.write_vectors("idx_a", rows(50, 4))
    assert hnsw_indexes("idx_a") == []
    adapter.swap_alias("live", "idx_a", expected=None)
    assert len(hnsw_indexes("idx_a")) == 1
    assert "vector_cosine_ops" in hnsw_indexes("idx_a")[0]
    adapter.swap_alias("probe", "idx_a", expected=None)
    assert len(hnsw_indexes("idx_a")) == 1
    pg.execute("SET enable_seqscan = off")
    plan = " ".join(
        str(r[0])
        for r in pg.execute("EXPLAIN SELECT id FROM live ORDER BY embedding <=> '[1,2,3,4]'::vector LIMIT 3")
    )
    assert "idx_a_embedding_idx" in plan


def test_pgvector_names_it_does_not_own_are_left_alone(
    adapter: VectorStoreAdapter, pg: psycopg.Connection[Any]
) -> None:
    adapter.ping()
    pg.execute("CREATE TABLE someone_elses (id int)")
    adapter.drop("someone_elses")
    assert pg.execute("SELECT to_regclass('someone_elses') IS NOT NULL").fetchone() == (True,)
    with _Refused(INDEX_EXISTS):
        adapter.create_target("someone_elses", dimension=4, space="sa")
    assert not adapter.exists("someone_elses")
    adapter.drop_alias("someone_elses")
    assert pg.execute("SELECT to_regclass('someone_elses') IS NOT NULL").fetchone() == (True,)

    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.swap_alias("live", "idx_a", expected=None)
    with _Refused(INDEX_EXISTS):
        adapter.create_target("live", dimension=4, space="sa")
    with _Refused(INVALID_NAME):
        adapter.swap_alias("idx_a", "idx_a", expected=None)
    for reserved in ("modelforge_indexes", "modelforge_aliases"):
        with _Refused(INVALID_NAME):
            adapter.create_target(reserved, dimension=4, space="sa")
        with _Refused(INVALID_NAME):
            adapter.swap_alias(reserved, "idx_a", expected=None)


def test_pgvector_system_catalogue_names_are_ordinary_index_names(
    adapter: VectorStoreAdapter, pg: psycopg.Connection[Any]
) -> None:
    adapter.create_target("pg_class", dimension=2, space="sa")
    adapter.write_vectors("pg_class", [Row("a", "a", [1.0, 2.0])])
    assert adapter.count("pg_class") == 1
    adapter.swap_alias("pg_proc", "pg_class", expected=None)
    assert adapter.read_alias_target("pg_proc") == "pg_class"
    assert [h.id for h in adapter.search("pg_proc", [1.0, 2.0], space="sa", k=1)] == ["a"]
    assert pg.execute("SELECT count(*) FROM public.pg_class").fetchone() == (1,)


def test_pgvector_refuses_dimensions_its_search_index_cannot_hold(adapter: VectorStoreAdapter) -> None:
    for dimension in (0, 2001):
        with _Refused(INVALID_VALUE):
            adapter.create_target("idx_a", dimension=dimension, space="sa")
    adapter.create_target("idx_a", dimension=2000, space="sa")
    assert adapter.info("idx_a").dimension == 2000


def test_pgvector_rewriting_unchanged_rows_leaves_them_untouched(
    adapter: VectorStoreAdapter, pg: psycopg.Connection[Any]
) -> None:
    adapter.create_target("idx_a", dimension=4, space="sa")
    adapter.write_vectors("idx_a", rows(10, 4))

    def versions() -> dict[str, str]:
        return {str(r[0]): str(r[1]) for r in pg.execute("SELECT id, xmin::text FROM idx_a")}

    before = versions()
    changed = [*rows(9, 4), Row("doc009", "changed", vec(4, 10.0))]
    assert adapter.write_vectors("idx_a", changed) == 10
    after = versions()
    assert {k for k in before if before[k] != after[k]} == {"doc009"}
