"""Request bodies bounded in front of Django: ``MODELFORGE_MAX_REQUEST_BYTES`` applied before Django reads.

Django's ``ASGIHandler`` reads the whole body into a ``SpooledTemporaryFile`` (on disk past
``FILE_UPLOAD_MAX_MEMORY_SIZE``) before any middleware or view runs, so a size check in a middleware
came after the bytes had arrived: a declared 300 MiB body was answered 413 only once it had all been
sent, and a 1 GiB chunked body grew a worker's temp file to 1 GiB. And Django reads a body only by its
``Content-Length``: a chunked body (none) reached the view empty. ``BoundedBody`` wraps Django's
application and, for a request with a body:

1. refuses a declared ``Content-Length`` over the limit at once, before reading a byte of it (one within
   ``lean.DRAIN_BYTES`` is read and dropped first, so a client that writes before it reads gets the
   envelope, as the lean endpoints do: ``lean.read_bounded_body``);
2. reads a chunked body as it arrives, up to the limit, and refuses it past the limit;
3. hands Django the body (in memory: it is at most the limit) with its ``Content-Length``, so a chunked
   body is parsed like any other.

No endpoint takes an upload larger than the limit (artifacts reach the store from their sources, not
through a request body), so one limit serves every route. The lean endpoints (heartbeat, artifact store,
gateway) bound their own bodies and are dispatched before this (modelforge/asgi.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings

from modelforge import lean
from modelforge.errors import codes

logger = logging.getLogger("modelforge.request")

_WANTED = frozenset((b"content-length", b"transfer-encoding", b"x-correlation-id"))


class BoundedBody:
    """An ASGI application: ``app`` (Django's), with request bodies bounded before it reads them."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: lean.Receive, send: lean.Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = lean.request_headers(scope, _WANTED)
        declared = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if not chunked and (declared is None or declared == "0"):  # no body: nothing to bound
            await self.app(scope, receive, send)
            return
        watched = _Watched(receive)
        try:
            body = await lean.read_bounded_body(watched, headers)
        except lean.BodyTooLarge as exc:
            await _refuse(scope, send, headers, exc)
            return
        if watched.gone:  # the client went away mid-body: what arrived is not the request
            return
        if chunked:
            scope = {**scope, "headers": _with_length(scope["headers"], len(body))}
        await self.app(scope, _Replay(body, receive), send)


class _Watched:
    """``receive``, noting a disconnect (``read_bounded_body`` takes its empty message as the end)."""

    __slots__ = ("gone", "receive")

    def __init__(self, receive: lean.Receive) -> None:
        self.receive = receive
        self.gone = False

    async def __call__(self) -> dict[str, Any]:
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.gone = True
        return message


class _Replay:
    """The body already read, as one message; then the server's ``receive`` (Django listens on it for the
    client going away while the view runs)."""

    __slots__ = ("body", "receive")

    def __init__(self, body: bytes, receive: lean.Receive) -> None:
        self.body: bytes | None = body
        self.receive = receive

    async def __call__(self) -> dict[str, Any]:
        if self.body is None:
            return await self.receive()
        body, self.body = self.body, None
        return {"type": "http.request", "body": body, "more_body": False}


def _with_length(raw: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    """The request's headers with ``Transfer-Encoding`` replaced by the ``Content-Length`` Django reads by."""
    kept = [(name, value) for name, value in raw if name not in (b"transfer-encoding", b"content-length")]
    return [*kept, (b"content-length", str(length).encode())]


async def _refuse(
    scope: dict[str, Any], send: lean.Send, headers: dict[str, str], exc: lean.BodyTooLarge
) -> None:
    started = time.monotonic()
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    declared = headers.get("content-length", "")
    size = f"is {declared} bytes" if declared.isdigit() else "goes on past the limit"
    message = f"The request body {size}; the limit is {limit} (MODELFORGE_MAX_REQUEST_BYTES)."
    correlation_id = lean.correlate(headers)
    await lean.refuse(send, 413, codes.PAYLOAD_TOO_LARGE, message, correlation_id, exc.headers)
    if logger.isEnabledFor(logging.INFO):
        lean.log_access(logger, logging.INFO, scope["method"], scope["path"], 413, started)
