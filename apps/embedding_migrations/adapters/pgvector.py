"""PostgreSQL + pgvector: an index is a table, the alias a view over it.

Everything lives in the connection's current schema:

- ``modelforge_indexes(name, space, dimension, created_at)``: the indexes this adapter created;
- ``<index>(id text COLLATE "C" PRIMARY KEY, content text, embedding vector(<dimension>))``; ids sort as
  Python sorts them, so keyset paging follows ``sorted()``. Its HNSW index (cosine distance) is built when
  an alias first points at it, in the swap's transaction before the view changes: one bulk build after the
  re-index costs a fraction of growing the graph row by row (100,000 rows of 16 dimensions on two cores:
  written in 3.5 s and built in about 60 s, against 190 s of writes into an indexed table);
- ``<alias>``: the view ``SELECT id, content, embedding, '<space>'::text AS space FROM <index>``. Its target
  is read from the view's own dependencies; ``modelforge_aliases(alias, index, swapped_at)`` records swaps.

A search filters on the view's constant ``space`` column, which the planner folds before any distance is
computed: a query made in another space (of any dimension) gets no rows, never an error.

Connections: a few idle ones are kept per adapter and proved alive (``SELECT 1``) before each use, so a
store that restarted costs one reconnect, never a failed call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg import errors, sql
from psycopg.pq import TransactionStatus

from .base import (
    ALIAS_MOVED,
    DIMENSION_MISMATCH,
    INDEX_EXISTS,
    INDEX_IN_USE,
    INDEX_NOT_FOUND,
    INVALID_NAME,
    INVALID_VALUE,
    STORE_UNAVAILABLE,
    AdapterError,
    Document,
    Hit,
    IndexInfo,
    Row,
    VectorStoreAdapter,
    check_name,
)

Connection = psycopg.Connection[Any]

INDEXES_TABLE = "modelforge_indexes"
ALIASES_TABLE = "modelforge_aliases"
RESERVED_NAMES = frozenset({INDEXES_TABLE, ALIASES_TABLE})
MAX_INDEXED_DIMENSION = 2000  # pgvector 0.6's HNSW indexes vectors of at most 2000 dimensions
MAX_VECTOR_DIMENSION = 16000  # the vector type's own limit (a query vector)
FLOAT32_MAX = 3.4028234663852886e38
HNSW_EF_SEARCH = 40  # pgvector's default: an HNSW scan returns at most this many rows
HNSW_EF_SEARCH_MAX = 1000
LOCK_TIMEOUT = "5s"  # a swap or drop queued behind a long query would block every search behind it
IDLE_CONNECTIONS = 4

_RELKIND = sql.SQL(
    "SELECT c.relkind FROM pg_class AS c WHERE c.oid = to_regclass(format('%%I.%%I', %s::text, %s::text))"
)
_ALIAS_TARGET = sql.SQL(
    """
    SELECT c.relkind, (
        SELECT min(t.relname)::text
        FROM pg_rewrite AS r
        JOIN pg_depend AS d
          ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.refclassid = 'pg_class'::regclass
        JOIN pg_class AS t ON t.oid = d.refobjid AND t.oid <> c.oid AND t.relkind IN ('r', 'p')
        WHERE r.ev_class = c.oid
    )
    FROM pg_class AS c
    WHERE c.oid = to_regclass(format('%%I.%%I', %s::text, %s::text))
    """
)
_DEPENDENT_VIEWS = sql.SQL(
    """
    SELECT DISTINCT v.relname::text
    FROM pg_depend AS d
    JOIN pg_rewrite AS r ON r.oid = d.objid
    JOIN pg_class AS v ON v.oid = r.ev_class AND v.oid <> d.refobjid
    WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
      AND d.refobjid = to_regclass(format('%%I.%%I', %s::text, %s::text))
    ORDER BY 1
    """
)
_HAS_HNSW = sql.SQL(
    """
    SELECT 1 FROM pg_index AS i
    JOIN pg_class AS ic ON ic.oid = i.indexrelid
    JOIN pg_am AS am ON am.oid = ic.relam AND am.amname = 'hnsw'
    WHERE i.indrelid = to_regclass(format('%%I.%%I', %s::text, %s::text))
    """
)


def check_values(values: list[float]) -> list[float]:
    """``values``, unless one is NaN, an infinity or past 32-bit float range (``INVALID_VALUE``)."""
    magnitudes = list(map(abs, values))
    if magnitudes and (not math.isfinite(sum(magnitudes)) or max(magnitudes) > FLOAT32_MAX):
        raise AdapterError(
            INVALID_VALUE, "a vector holds NaN, an infinity or a value past 32-bit float range."
        )
    return values


def vector_literal(values: Sequence[float]) -> str:
    """``values`` as pgvector's text form ``[x,y,...]``; ``INVALID_VALUE`` for what pgvector cannot hold."""
    floats = check_values([float(value) for value in values])
    if not 1 <= len(floats) <= MAX_VECTOR_DIMENSION:
        raise AdapterError(INVALID_VALUE, f"a vector has {len(floats)} dimensions (1 to 16000 are possible).")
    return "[" + ",".join(map(repr, floats)) + "]"


def parse_vector(text: str) -> list[float]:
    """pgvector's text form ``[x,y,...]`` as floats."""
    inner = text.strip()[1:-1]
    return [float(part) for part in inner.split(",")] if inner else []


def _translate(exc: psycopg.Error, subject: str) -> AdapterError:
    detail = (exc.diag.message_primary or str(exc)).strip().splitlines()
    message = detail[0] if detail else type(exc).__name__
    if isinstance(exc, errors.UndefinedTable | errors.UndefinedColumn):
        return AdapterError(INDEX_NOT_FOUND, f"{subject} does not exist ({message}).")
    if isinstance(exc, errors.DependentObjectsStillExist):
        return AdapterError(INDEX_IN_USE, f"{subject} is in use ({message}).")
    if isinstance(exc, psycopg.DataError):
        code = DIMENSION_MISMATCH if "dimension" in message else INVALID_VALUE
        return AdapterError(code, f"{subject}: {message}")
    return AdapterError(STORE_UNAVAILABLE, f"the vector store failed: {message}")


class PgvectorAdapter(VectorStoreAdapter):
    """Indexes as pgvector tables, aliases as views (see the module's docstring for the layout)."""

    kind = "pgvector"
    label = "PostgreSQL + pgvector"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._guard = threading.Lock()
        self._idle: list[Connection] = []
        self._schema: str | None = None

    def close(self) -> None:
        with self._guard:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __del__(self) -> None:
        with suppress(Exception):
            self.close()

    # Connections

    def _connect(self) -> Connection:
        conn = psycopg.connect(self.dsn, connect_timeout=5, autocommit=True)
        if self._schema is None:
            row = conn.execute("SELECT current_schema()").fetchone()
            if row is None or row[0] is None:
                conn.close()
                raise AdapterError(STORE_UNAVAILABLE, "the vector store's search_path names no schema.")
            self._schema = str(row[0])
        return conn

    def _checkout(self) -> Connection:
        while True:
            with self._guard:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            if not conn.closed and not conn.broken:
                try:
                    conn.execute("SELECT 1")
                    return conn
                except psycopg.Error:
                    pass
            conn.close()

    def _checkin(self, conn: Connection) -> None:
        reusable = (
            not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
        )
        if reusable:
            with self._guard:
                if len(self._idle) < IDLE_CONNECTIONS:
                    self._idle.append(conn)
                    return
        conn.close()

    @contextmanager
    def _session(self, subject: str) -> Iterator[Connection]:
        """A live connection; psycopg's errors leave it as ``AdapterError`` naming ``subject``."""
        try:
            conn = self._checkout()
        except psycopg.Error as exc:
            raise AdapterError(STORE_UNAVAILABLE, f"cannot connect to the vector store: {exc}") from exc
        try:
            yield conn
        except psycopg.Error as exc:
            self._checkin(conn)
            raise _translate(exc, subject) from exc
        except BaseException:
            self._checkin(conn)
            raise
        self._checkin(conn)

    # Names and catalogue

    def _table(self, name: str) -> sql.Identifier:
        assert self._schema is not None
        return sql.Identifier(self._schema, name)

    @staticmethod
    def _checked(kind: str, name: str) -> str:
        check_name(kind, name)
        if name in RESERVED_NAMES:
            raise AdapterError(INVALID_NAME, f"{kind} name {name!r} is the adapter's own bookkeeping table.")
        return name

    def _setup(self, conn: Connection) -> None:
        self._lock(conn, "#setup")
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, space text NOT NULL,"
                " dimension int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            ).format(self._table(INDEXES_TABLE))
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (alias text PRIMARY KEY, index text NOT NULL,"
                " swapped_at timestamptz NOT NULL DEFAULT now())"
            ).format(self._table(ALIASES_TABLE))
        )

    def _lock(self, conn: Connection, name: str) -> None:
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"modelforge-vectors:{self._schema}:{name}"],
        )

    def _relkind(self, conn: Connection, name: str) -> str | None:
        row = conn.execute(_RELKIND, [self._schema, name]).fetchone()
        return None if row is None else str(row[0])

    def _registered(self, conn: Connection, name: str | None) -> list[tuple[str, str, int]]:
        """``(name, space, dimension)`` of registered indexes whose table exists (``name``: only that one)."""
        query = sql.SQL(
            "SELECT m.name, m.space, m.dimension FROM {} AS m JOIN pg_class AS c"
            " ON c.oid = to_regclass(format('%%I.%%I', %s::text, m.name)) AND c.relkind = 'r'"
            " WHERE %s::text IS NULL OR m.name = %s ORDER BY m.name"
        ).format(self._table(INDEXES_TABLE))
        rows = conn.execute(query, [self._schema, name, name]).fetchall()
        return [(str(n), str(space), int(dimension)) for n, space, dimension in rows]

    def _index(self, conn: Connection, index: str) -> tuple[str, int]:
        """The ``(space, dimension)`` of ``index``; ``INDEX_NOT_FOUND`` unless it is one of ours."""
        found = self._registered(conn, index)
        if not found:
            raise AdapterError(INDEX_NOT_FOUND, f"index {index!r} does not exist.")
        return found[0][1], found[0][2]

    def _build_search_index(self, conn: Connection, index: str) -> None:
        """Give ``index`` its HNSW index unless it has one: one bulk build after the rows are written."""
        row = conn.execute(_HAS_HNSW, [self._schema, index]).fetchone()
        if row is None:
            conn.execute(
                sql.SQL("CREATE INDEX ON {} USING hnsw (embedding vector_cosine_ops)").format(
                    self._table(index)
                )
            )

    def _count(self, conn: Connection, index: str) -> int:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._table(index))).fetchone()
        assert row is not None
        return int(row[0])

    def _alias_target(self, conn: Connection, alias: str) -> tuple[str | None, str | None]:
        row = conn.execute(_ALIAS_TARGET, [self._schema, alias]).fetchone()
        if row is None:
            return None, None
        kind, target = str(row[0]), row[1]
        return kind, (str(target) if kind == "v" and target is not None else None)

    # The interface

    def ping(self) -> None:
        with self._session("the vector store") as conn, conn.transaction():
            self._setup(conn)

    def create_target(self, index: str, *, dimension: int, space: str) -> None:
        self._checked("index", index)
        if not 1 <= dimension <= MAX_INDEXED_DIMENSION:
            raise AdapterError(
                INVALID_VALUE,
                f"index {index!r}: pgvector's HNSW index holds 1 to {MAX_INDEXED_DIMENSION} dimensions,"
                f" not {dimension}.",
            )
        with self._session(f"index {index!r}") as conn, conn.transaction():
            self._setup(conn)
            self._lock(conn, index)
            kind = self._relkind(conn, index)
            if kind is not None:
                found = self._registered(conn, index) if kind == "r" else []
                if found and found[0][1:] == (space, dimension):
                    return
                if found:
                    what = f"an index for {found[0][2]} dimensions of space {found[0][1]!r}"
                elif kind == "v":
                    what = "an alias"
                else:
                    what = "a relation this adapter did not create"
                raise AdapterError(
                    INDEX_EXISTS,
                    f"index {index!r}: {what} has that name (asked for {dimension} dimensions of {space!r}).",
                )
            table = self._table(index)
            conn.execute(
                sql.SQL(
                    'CREATE TABLE {} (id text COLLATE "C" PRIMARY KEY, content text NOT NULL,'
                    " embedding vector({}) NOT NULL)"
                ).format(table, sql.SQL(str(int(dimension))))
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (name, space, dimension) VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE"
                    " SET space = EXCLUDED.space, dimension = EXCLUDED.dimension, created_at = now()"
                ).format(self._table(INDEXES_TABLE)),
                [index, space, dimension],
            )

    def write_vectors(self, index: str, rows: Sequence[Row]) -> int:
        """Upsert ``rows`` (the last row of an id wins); returns how many distinct ids were written."""
        self._checked("index", index)
        with self._session(f"index {index!r}") as conn, conn.transaction():
            _, dimension = self._index(conn, index)
            for row in rows:
                if len(row.embedding) != dimension:
                    raise AdapterError(
                        DIMENSION_MISMATCH,
                        f"index {index!r} holds vectors of {dimension} dimensions; row {row.id!r} has"
                        f" {len(row.embedding)}.",
                    )
            latest = {row.id: row for row in rows}
            if not latest:
                return 0
            ids = list(latest)
            contents = [row.content for row in latest.values()]
            flat = check_values([float(x) for row in latest.values() for x in row.embedding])
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} AS t (id, content, embedding)"
                    " SELECT u.id, u.content, (%b::float8[])[(u.n - 1) * %s + 1 : u.n * %s]::vector"
                    " FROM unnest(%b::text[], %b::text[]) WITH ORDINALITY AS u(id, content, n)"
                    " ON CONFLICT (id) DO UPDATE"
                    " SET content = EXCLUDED.content, embedding = EXCLUDED.embedding"
                    " WHERE (t.content, t.embedding) IS DISTINCT FROM (EXCLUDED.content, EXCLUDED.embedding)"
                ).format(self._table(index)),
                [flat, dimension, dimension, ids, contents],
            )
        return len(ids)

    def count(self, index: str) -> int:
        self._checked("index", index)
        with self._session(f"index {index!r}") as conn:
            self._index(conn, index)
            return self._count(conn, index)

    def info(self, index: str) -> IndexInfo:
        self._checked("index", index)
        with self._session(f"index {index!r}") as conn:
            space, dimension = self._index(conn, index)
            return IndexInfo(name=index, space=space, dimension=dimension, count=self._count(conn, index))

    def exists(self, index: str) -> bool:
        self._checked("index", index)
        try:
            with self._session(f"index {index!r}") as conn:
                return bool(self._registered(conn, index))
        except AdapterError as exc:
            if exc.code == INDEX_NOT_FOUND:
                return False
            raise

    def read_documents(self, index: str, *, after: str | None, limit: int) -> list[Document]:
        self._checked("index", index)
        with self._session(f"index {index!r}") as conn:
            self._index(conn, index)
            if limit < 1:
                return []
            table = self._table(index)
            if after is None:
                query = sql.SQL("SELECT id, content FROM {} ORDER BY id LIMIT %s").format(table)
                params: list[object] = [limit]
            else:
                query = sql.SQL("SELECT id, content FROM {} WHERE id > %s ORDER BY id LIMIT %s").format(table)
                params = [after, limit]
            rows = conn.execute(query, params).fetchall()
        return [Document(id=str(row[0]), content=str(row[1])) for row in rows]

    def sample(self, index: str, *, n: int, seed: int) -> list[Row]:
        self._checked("index", index)
        with self._session(f"index {index!r}") as conn:
            self._index(conn, index)
            if n < 1:
                return []
            rows = conn.execute(
                sql.SQL(
                    "SELECT id, content, embedding::text FROM {} ORDER BY md5(id || ':' || %s), id LIMIT %s"
                ).format(self._table(index)),
                [str(seed), n],
            ).fetchall()
        return [Row(id=str(r[0]), content=str(r[1]), embedding=parse_vector(str(r[2]))) for r in rows]

    def read_vectors(self, index: str, ids: Sequence[str]) -> dict[str, list[float]]:
        self._checked("index", index)
        with self._session(f"index {index!r}") as conn:
            self._index(conn, index)
            if not ids:
                return {}
            rows = conn.execute(
                sql.SQL("SELECT id, embedding::text FROM {} WHERE id = ANY(%s::text[])").format(
                    self._table(index)
                ),
                [list(ids)],
            ).fetchall()
        return {str(row[0]): parse_vector(str(row[1])) for row in rows}

    def read_alias_target(self, alias: str) -> str | None:
        """The table the alias's view selects from (the view is the truth, not ``modelforge_aliases``)."""
        self._checked("alias", alias)
        with self._session(f"alias {alias!r}") as conn:
            return self._alias_target(conn, alias)[1]

    def swap_alias(self, alias: str, index: str, *, expected: str | None) -> None:
        self._checked("alias", alias)
        self._checked("index", index)
        with self._session(f"alias {alias!r} or index {index!r}") as conn, conn.transaction():
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
            self._setup(conn)
            self._lock(conn, alias)
            kind, current = self._alias_target(conn, alias)
            if kind is not None and kind != "v":
                raise AdapterError(
                    INVALID_NAME, f"alias {alias!r}: a table of that name exists, not an alias."
                )
            if current != expected:
                raise AdapterError(ALIAS_MOVED, f"alias {alias!r} points at {current!r}, not {expected!r}.")
            space, _ = self._index(conn, index)
            self._lock(conn, index)
            self._build_search_index(conn, index)
            if current != index:
                view = self._table(alias)
                conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view))
                conn.execute(
                    sql.SQL(
                        "CREATE VIEW {} AS SELECT id, content, embedding, {}::text AS space FROM {}"
                    ).format(view, sql.Literal(space), self._table(index))
                )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (alias, index, swapped_at) VALUES (%s, %s, now())"
                    " ON CONFLICT (alias) DO UPDATE"
                    " SET index = EXCLUDED.index, swapped_at = EXCLUDED.swapped_at"
                ).format(self._table(ALIASES_TABLE)),
                [alias, index],
            )

    def drop_alias(self, alias: str) -> None:
        """Drop the alias's view and its record; a name that is not a view is left alone."""
        self._checked("alias", alias)
        with self._session(f"alias {alias!r}") as conn, conn.transaction():
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
            self._setup(conn)
            self._lock(conn, alias)
            if self._relkind(conn, alias) == "v":
                conn.execute(sql.SQL("DROP VIEW {}").format(self._table(alias)))
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE alias = %s").format(self._table(ALIASES_TABLE)), [alias]
            )

    def drop(self, index: str) -> None:
        """Drop ``index``; a name that is not an index this adapter created is left alone."""
        self._checked("index", index)
        with self._session(f"index {index!r}") as conn, conn.transaction():
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
            self._setup(conn)
            self._lock(conn, index)
            if self._registered(conn, index):
                views = [str(row[0]) for row in conn.execute(_DEPENDENT_VIEWS, [self._schema, index])]
                if views:
                    raise AdapterError(
                        INDEX_IN_USE, f"index {index!r} is the target of alias {', '.join(views)}."
                    )
                conn.execute(sql.SQL("DROP TABLE {}").format(self._table(index)))
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE name = %s").format(self._table(INDEXES_TABLE)), [index]
            )

    def search(self, alias: str, vector: Sequence[float], *, space: str, k: int) -> list[Hit]:
        self._checked("alias", alias)
        if k < 1:
            return []
        params = [vector_literal(vector), space, k]
        with self._session(f"alias {alias!r}") as conn:
            query = sql.SQL(
                "SELECT id, content, embedding <=> %s::vector AS distance, space FROM {}"
                " WHERE space = %s ORDER BY distance LIMIT %s"
            ).format(self._table(alias))
            if k > HNSW_EF_SEARCH:
                with conn.transaction():
                    conn.execute(
                        "SELECT set_config('hnsw.ef_search', %s, true)", [str(min(k, HNSW_EF_SEARCH_MAX))]
                    )
                    rows = conn.execute(query, params, prepare=False).fetchall()
            else:
                rows = conn.execute(query, params, prepare=False).fetchall()
        return [Hit(id=str(r[0]), content=str(r[1]), distance=float(r[2]), space=str(r[3])) for r in rows]

    def list_indexes(self) -> list[IndexInfo]:
        try:
            with self._session("the index list") as conn:
                return [
                    IndexInfo(name=name, space=space, dimension=dimension, count=self._count(conn, name))
                    for name, space, dimension in self._registered(conn, None)
                ]
        except AdapterError as exc:
            if exc.code == INDEX_NOT_FOUND:
                return []
            raise
