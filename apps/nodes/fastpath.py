"""``POST /api/v1/agent/heartbeat`` as a lean ASGI endpoint mounted beside Django.

Every node reports every few seconds, so this is the control plane's hottest write. It skips Django's
middleware and view stack (sessions, CSRF, messages: nothing a node uses) and writes the heartbeats that
arrive together as one SQL statement on an async psycopg pool (``HeartbeatBatcher``; each is answered
after that statement commits), while keeping the platform's contract (modelforge/lean.py): the
correlation id, the error envelope, the exact ``Internal Server Error`` body, a bounded request size.
bench/heartbeats measures it; docs/DECISIONS.md says why it exists.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from django.conf import settings
from django.utils import timezone

from apps.nodes import codes, engine_signals
from apps.nodes.heartbeat import (
    HEARTBEAT_SQL,
    HeartbeatRow,
    InvalidReport,
    batch_params,
    heartbeat_row,
    parse_report,
)
from apps.nodes.models import digest
from modelforge import auththrottle
from modelforge.errors import codes as error_codes
from modelforge.lean import (
    JSON,
    BodyTooLarge,
    Receive,
    Send,
    correlate,
    drain_unread_body,
    internal_error,
    log_access,
    read_bounded_body,
    refuse,
    request_headers,
    respond,
)

logger = logging.getLogger("modelforge.request")
error_logger = logging.getLogger("modelforge.errors")

PATH = "/api/v1/agent/heartbeat"

# Batches being written at once per web process. Two keep the process parsing and answering while the
# database writes, and PostgreSQL busy while the process answers a batch: measured, 5,025-5,353
# heartbeats/s against 4,416-4,687 with one (bench/heartbeats, defaults).
BATCHES_IN_FLIGHT = 2
MAX_BATCH = 256

# The heartbeat pool's sessions run nothing but HEARTBEAT_SQL. Its batch arrives as one JSON text, which
# the planner takes for 100 rows: left alone it hash-joins the whole node and GPU tables on every batch
# (EXPLAIN ANALYZE over 2,000 nodes x 8 GPUs: 4.6 ms for 8 heartbeats, against 1.6 ms with these). The
# plan never depends on the parameter, so one generic plan serves every batch (no planning per batch
# once psycopg has prepared the statement).
PLANNER_OPTIONS = (
    "-c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off "
    "-c plan_cache_mode=force_generic_plan"
)


def _conninfo() -> dict[str, Any]:
    db = settings.DATABASES["default"]
    options = {k: v for k, v in db.get("OPTIONS", {}).items() if k not in ("pool",)}
    return {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        **options,
    }


Row = tuple[Any, bool, str]
# Each batch is written as one statement on one pooled connection; ``execute`` returns the rows by ``k``.
Execute = Callable[[list[HeartbeatRow]], Awaitable[dict[int, Row]]]


class NotRecorded(Exception):
    """The heartbeat's batch was not committed for a reason that passes (the database unreachable, its
    session ended, a lock or deadlock): the caller answers 503 ``HEARTBEAT_NOT_RECORDED``."""


class HeartbeatBatcher:
    """Write-behind with the answer held: the heartbeats one process receives while its previous batch is
    being written go together as the next batch, one statement and one commit; each caller gets its own
    row (or ``None``: no node has that credential) only after that commit.

    No timer: a heartbeat arriving at an idle process is written at once, and batches grow only as the
    database takes time (group commit, one level up). At most ``in_flight`` batches are being written
    at a time, each at most ``max_batch`` heartbeats. A credential already in a batch being formed or
    written waits for the next one (the GPU upsert cannot touch a row twice in one statement, and two
    batches in flight could otherwise write a node's heartbeats out of order).

    A batch that fails with an error that passes (``psycopg.OperationalError``: the session ended, the
    database unreachable, a deadlock or lock timeout; the execute has already retried once on a fresh
    connection) fails each of its callers with ``NotRecorded``. Any other error is the statement's own:
    each heartbeat of the batch is then written alone, so a heartbeat the database refuses fails only its
    own caller, with that error (a 500, as before batching), and the others are recorded."""

    def __init__(
        self, execute: Execute, *, in_flight: int = BATCHES_IN_FLIGHT, max_batch: int = MAX_BATCH
    ) -> None:
        self._execute = execute
        self._in_flight = in_flight
        self._max_batch = max_batch
        self._pending: list[tuple[HeartbeatRow, asyncio.Future[Row | None]]] = []
        self._busy: set[str] = set()  # credentials in a batch being written
        self._writing = 0  # writers running; counted down in the very step that finds nothing pending
        self._tasks: set[asyncio.Task[None]] = set()  # held, so a running writer is never collected

    async def record(self, row: HeartbeatRow) -> Row | None:
        future: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        self._pending.append((row, future))
        if self._writing < self._in_flight:
            self._writing += 1
            task = asyncio.create_task(self._write())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    def _take(self) -> list[tuple[HeartbeatRow, asyncio.Future[Row | None]]]:
        batch: list[tuple[HeartbeatRow, asyncio.Future[Row | None]]] = []
        later: list[tuple[HeartbeatRow, asyncio.Future[Row | None]]] = []
        for item in self._pending:
            if len(batch) < self._max_batch and item[0].credential_hash not in self._busy:
                self._busy.add(item[0].credential_hash)
                batch.append(item)
            else:
                later.append(item)
        self._pending = later
        return batch

    async def _write(self) -> None:
        try:
            while batch := self._take():
                try:
                    await self._write_batch(batch)
                except BaseException as exc:  # never leave a caller waiting, whatever happened
                    for _, future in batch:
                        if not future.done():
                            error = exc if isinstance(exc, Exception) else NotRecorded(repr(exc))
                            future.set_exception(error)
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    # A credential held back while this batch was written goes in this writer's next one.
                    self._busy.difference_update(row.credential_hash for row, _ in batch)
        finally:
            # No await between the empty take and this: a heartbeat appended after it starts a writer.
            self._writing -= 1

    async def _write_batch(self, batch: list[tuple[HeartbeatRow, asyncio.Future[Row | None]]]) -> None:
        for position, (row, _) in enumerate(batch):
            row.k = position
        try:
            written = await self._execute([row for row, _ in batch])
        except psycopg.OperationalError as exc:
            error = NotRecorded(f"{type(exc).__name__}: {exc}".strip())
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        except Exception:
            if len(batch) == 1:
                raise
            for item in batch:  # the statement's own error: find whose, write the others
                try:
                    await self._write_batch([item])
                except Exception as exc:
                    if not item[1].done():
                        item[1].set_exception(exc)
            return
        for position, (_, future) in enumerate(batch):
            if not future.done():  # a caller gone (client disconnected) was still written
                future.set_result(written.get(position))


class HeartbeatEndpoint:
    """The ASGI callable; one instance per process, its pool opened on first use in the serving loop."""

    def __init__(self, *, in_flight: int = BATCHES_IN_FLIGHT, max_batch: int = MAX_BATCH) -> None:
        self._pool: Any = None
        self._opening = asyncio.Lock()  # the two writers' first batches open one pool, not one each
        self.batcher = HeartbeatBatcher(self._write, in_flight=in_flight, max_batch=max_batch)

    async def _get_pool(self) -> Any:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is None:
                from psycopg_pool import AsyncConnectionPool

                kwargs = {k: v for k, v in _conninfo().items() if v is not None}
                kwargs["options"] = f"{kwargs.get('options', '')} {PLANNER_OPTIONS}".strip()
                pool = AsyncConnectionPool(
                    kwargs={**kwargs, "autocommit": True},
                    min_size=1,
                    max_size=settings.DATABASE_POOL_SIZE,
                    timeout=5,
                    open=False,
                )
                await pool.open()
                self._pool = pool
        return self._pool

    async def _write(self, rows: list[HeartbeatRow]) -> dict[int, Row]:
        """One statement for the batch; a pooled session found dead (a restore's switch-over, a database
        restart) makes the pool check every idle one, and the batch is tried once more on a fresh
        connection. The happy path pays nothing for it (no check per checkout on the hottest write)."""
        pool = await self._get_pool()
        params = batch_params(rows)
        for attempt in (1, 2):
            try:
                async with pool.connection() as conn:
                    cursor = await conn.execute(HEARTBEAT_SQL, params)
                    written: list[tuple[int, Any, bool, str]] = await cursor.fetchall()
                    return {k: (node_id, enabled, was) for k, node_id, enabled, was in written}
            except psycopg.OperationalError:
                if attempt == 2:
                    raise
                await pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = time.monotonic()
        headers = request_headers(scope)
        correlation_id = correlate(headers)
        status, body, extra = await self._handle(scope, receive, headers)
        if status == 500:
            await internal_error(send, correlation_id)
        elif "code" in body:
            await refuse(send, status, body["code"], body["message"], correlation_id, extra)
        else:
            await respond(send, status, json.dumps(body).encode(), JSON, correlation_id, extra)
        level = logging.DEBUG if status == 200 else logging.INFO
        if logger.isEnabledFor(level):
            log_access(logger, level, scope["method"], PATH, status, started)

    async def _handle(
        self, scope: dict[str, Any], receive: Receive, headers: dict[str, str]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if scope["method"] != "POST":
            return await _unread(
                receive,
                headers,
                _error(405, error_codes.METHOD_NOT_ALLOWED, "Only POST is allowed here.", {"Allow": "POST"}),
            )
        if not headers.get("content-type", "").startswith("application/json"):
            return await _unread(
                receive,
                headers,
                _error(415, error_codes.UNSUPPORTED_MEDIA_TYPE, error_codes.DEFAULT_MESSAGES[415]),
            )
        scheme, _, credential = headers.get("authorization", "").partition(" ")
        credential = credential.strip()
        unauthorized = {"WWW-Authenticate": 'Bearer realm="modelforge-agent"'}
        if scheme.lower() != "bearer" or not credential:
            return await _unread(
                receive,
                headers,
                _error(
                    401,
                    codes.NODE_CREDENTIAL_INVALID,
                    "A node credential is required: Authorization: Bearer <credential>.",
                    unauthorized,
                ),
            )
        try:
            body = await read_bounded_body(receive, headers)
        except BodyTooLarge as exc:
            return _error(413, error_codes.PAYLOAD_TOO_LARGE, error_codes.DEFAULT_MESSAGES[413], exc.headers)
        try:
            report = parse_report(body)
        except InvalidReport as exc:
            return _error(400, exc.code, exc.message)
        now = timezone.now()
        try:
            row = await self.batcher.record(heartbeat_row(digest(credential), report, now))
        except NotRecorded as exc:
            error_logger.warning("heartbeat not recorded: %s", exc)
            return _error(
                503,
                codes.HEARTBEAT_NOT_RECORDED,
                "The heartbeat was not recorded: the database did not complete its write. "
                "The agent's next heartbeat reports again.",
                {"Retry-After": str(settings.HEARTBEAT_INTERVAL)},
            )
        except Exception:
            error_logger.exception("heartbeat could not be recorded")
            return 500, {}, {}
        if row is None:
            # The credential matches no node; the same statement that would have recorded it said so.
            # Only failures are counted, so a heartbeat that succeeds never waits on Redis.
            source = auththrottle.scope_source(scope)
            retry_after = await auththrottle.throttle.afailed(auththrottle.AGENT, source)
            if retry_after is not None:
                refusal = auththrottle.refusal(auththrottle.NODE_CREDENTIAL, source, retry_after)
                return _error(refusal.status, refusal.code, refusal.message, refusal.headers)
            return _error(
                401,
                codes.NODE_CREDENTIAL_INVALID,
                "This node credential is not valid; re-enroll the agent with a new token.",
                unauthorized,
            )
        node_id, enabled, _ = row
        if report.servers:
            # To Redis, not the database, and not waited for (apps/nodes/engine_signals.py): only once the
            # credential has proved which node this is.
            engine_signals.writer.submit(str(node_id), report.servers, now.timestamp())
        return (
            200,
            {
                "node_id": str(node_id),
                "liveness": "online",
                "enabled": enabled,
                "heartbeat_interval_s": settings.HEARTBEAT_INTERVAL,
            },
            {},
        )


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    return status, {"code": code, "message": message}, headers or {}


async def _unread(
    receive: Receive, headers: dict[str, str], refusal: tuple[int, dict[str, Any], dict[str, str]]
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A refusal answered before the body is read: the body is dropped first (modelforge.lean), so a
    client still writing it reads the refusal instead of a reset; past the bound, the connection closes."""
    if not await drain_unread_body(receive, headers):
        refusal[2]["Connection"] = "close"
    return refusal


endpoint = HeartbeatEndpoint()
