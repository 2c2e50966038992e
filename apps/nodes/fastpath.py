"""``POST /api/v1/agent/heartbeat`` as a lean ASGI endpoint mounted beside Django.

Every node reports every few seconds, so this is the control plane's hottest write. It skips Django's
middleware and view stack (sessions, CSRF, messages: nothing a node uses) and answers with one SQL
statement on an async psycopg pool, while keeping the platform's contract (modelforge/lean.py): the
correlation id, the error envelope, the exact ``Internal Server Error`` body, a bounded request size.
bench/heartbeats measures it; docs/DECISIONS.md says why it exists.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import psycopg
from django.conf import settings
from django.utils import timezone

from apps.nodes import codes
from apps.nodes.heartbeat import HEARTBEAT_SQL, InvalidReport, heartbeat_params, parse_report
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


class HeartbeatEndpoint:
    """The ASGI callable; one instance per process, its pool opened on first use in the serving loop."""

    def __init__(self) -> None:
        self._pool: Any = None

    async def _get_pool(self) -> Any:
        if self._pool is None:
            from psycopg_pool import AsyncConnectionPool

            kwargs = {k: v for k, v in _conninfo().items() if v is not None}
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

    async def _record(self, credential: str, report: Any) -> Any:
        """One statement; a pooled session found dead (a restore's switch-over, a database restart) makes
        the pool check every idle one, and the heartbeat is tried once more on a fresh connection. The
        happy path pays nothing for it (no check per checkout on the hottest write)."""
        pool = await self._get_pool()
        for attempt in (1, 2):
            try:
                async with pool.connection() as conn:
                    cursor = await conn.execute(
                        HEARTBEAT_SQL, heartbeat_params(credential, report, timezone.now())
                    )
                    return await cursor.fetchone()
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
        try:
            row = await self._record(credential, report)
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
