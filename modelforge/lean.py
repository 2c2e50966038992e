"""The kernel of the lean ASGI endpoints beside Django (agents' heartbeats, the artifact store, the serving
gateway): the route table they are mounted by, the correlation id, the error envelope and the exact 500
body, the access-log line, bounded request bodies.

Each endpoint skips Django's middleware for speed, so it must keep the platform's contract itself; this
module is that contract, written once. Nothing here adds work per request beyond what an endpoint did
before: a header dict built once, one response list, a log line only when one is written.

An app mounts its endpoint from ``AppConfig.ready()``::

    lean.route(prefix="/v1/", handler="apps.gateway.gateway.gateway")
    lean.route(exact="/api/v1/agent/heartbeat", handler="apps.nodes.fastpath.endpoint")

and the ASGI entry point (modelforge/asgi.py) dispatches by ``routes()``, importing no app itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from modelforge.errors import INTERNAL_SERVER_ERROR_BODY
from modelforge.logging import accept_or_generate, set_correlation_id

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Handler = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

JSON = b"application/json"
TEXT = b"text/plain"
# The access-log line every lean endpoint writes: method, path, status, milliseconds.
ACCESS_LINE = "%s %s -> %s in %.1f ms"


# --- The route table -------------------------------------------------------------------------------------

# (kind, path) -> handler or its import path; kind is "exact" or "prefix".
_registered: dict[tuple[str, str], Handler | str] = {}


def route(*, handler: Handler | str, exact: str | None = None, prefix: str | None = None) -> None:
    """Mount ``handler`` (an ASGI callable, or its dotted import path) at one ``exact`` path or at every
    path under ``prefix``; called from an app's ``AppConfig.ready()``.

    An import path is imported when the entry point builds its table (``routes()``, in the serving
    process), not here: a process that never serves (gunicorn's master, Celery, ``manage.py``) never
    imports the endpoint, and state an endpoint makes at import (a process id, a pool) is made in the
    worker that uses it. Registering the same thing twice is harmless; two handlers on one path refuse."""
    if (exact is None) == (prefix is None):
        raise ImproperlyConfigured("lean.route takes exactly one of exact= and prefix=")
    key = ("exact", exact) if exact is not None else ("prefix", str(prefix))
    if key[1] in ("", "/") or not key[1].startswith("/"):
        raise ImproperlyConfigured(f"lean.route: {key[1]!r} is not a path under the site root")
    if _registered.setdefault(key, handler) != handler:
        raise ImproperlyConfigured(f"lean.route: two handlers for the {key[0]} path {key[1]!r}")


def routes() -> tuple[dict[str, Handler], tuple[tuple[str, Handler], ...]]:
    """Every mounted endpoint, imported: exact paths in a dict (one lookup per request), then prefixes,
    longest first so a longer prefix wins over one it extends. An exact path wins over every prefix."""
    loaded = {key: import_string(h) if isinstance(h, str) else h for key, h in _registered.items()}
    exact = {path: handler for (kind, path), handler in loaded.items() if kind == "exact"}
    prefixes = sorted(
        ((path, handler) for (kind, path), handler in loaded.items() if kind == "prefix"),
        key=lambda item: -len(item[0]),
    )
    return exact, tuple(prefixes)


# --- The request: headers and correlation id ---------------------------------------------------------------


def request_headers(scope: dict[str, Any], wanted: Collection[bytes] | None = None) -> dict[str, str]:
    """The request's headers by lower-case name; only those named in ``wanted`` when given (the others are
    never decoded). ASGI servers give header names in lower case."""
    if wanted is None:
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in wanted}


def correlate(headers: dict[str, str]) -> str:
    """The request's correlation id, the caller's ``X-Correlation-ID`` when well formed or a new one, set
    for every log line the request writes."""
    correlation_id = accept_or_generate(headers.get("x-correlation-id"))
    set_correlation_id(correlation_id)
    return correlation_id


# --- The response: the envelope, the exact 500 -------------------------------------------------------------


def envelope(code: str, message: str, correlation_id: str) -> bytes:
    """An error body: exactly ``{"code", "message", "correlation_id"}``."""
    return json.dumps({"code": code, "message": message, "correlation_id": correlation_id}).encode()


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    correlation_id: str,
    headers: dict[str, str] | None = None,
) -> None:
    """A whole response in two messages: its type, length and correlation id, then ``headers`` (names
    sent in lower case), then the body."""
    raw = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-correlation-id", correlation_id.encode()),
    ]
    if headers:
        raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def refuse(
    send: Send,
    status: int,
    code: str,
    message: str,
    correlation_id: str,
    headers: dict[str, str] | None = None,
) -> None:
    """A refusal: the envelope, as JSON."""
    await respond(send, status, envelope(code, message, correlation_id), JSON, correlation_id, headers)


async def internal_error(send: Send, correlation_id: str) -> None:
    """A 500: the plain text ``Internal Server Error`` and nothing else; the story goes to the log."""
    await respond(send, 500, INTERNAL_SERVER_ERROR_BODY.encode(), TEXT, correlation_id)


def log_access(
    logger: logging.Logger, level: int, method: str, path: str, status: int, started: float
) -> None:
    """The access-log line (``ACCESS_LINE``), ``started`` a ``time.monotonic()`` reading. The caller
    decides whether a line is due (``logger.isEnabledFor``), so a request that writes none pays nothing."""
    logger.log(level, ACCESS_LINE, method, path, status, (time.monotonic() - started) * 1000)


# --- The request body: bounded --------------------------------------------------------------------------


# A client that writes its whole body before it reads (urllib, many HTTP libraries) saw a connection reset
# instead of the 413 when the answer came, and the connection closed, mid-body: the kernel resets a
# connection closed with unread data. So the rest of an oversized body is read and dropped before the
# refusal, up to this many bytes in all (16 x the default limit, a fraction of a second on any network the
# platform serves); a body declared larger than this, or still coming past it, is refused at once and the
# connection closed (``Connection: close``) rather than read for ever.
DRAIN_BYTES = 16 << 20


class BodyTooLarge(Exception):
    """The request body is over MODELFORGE_MAX_REQUEST_BYTES (declared or actual). ``drained``: the whole
    body was read, so the answer can be read by the client; otherwise the answer closes the connection."""

    def __init__(self, *, drained: bool) -> None:
        super().__init__("request body over MODELFORGE_MAX_REQUEST_BYTES")
        self.drained = drained

    @property
    def headers(self) -> dict[str, str]:
        """Headers for the refusal: ``Connection: close`` when the body was not drained."""
        return {} if self.drained else {"Connection": "close"}


async def read_bounded_body(receive: Receive, headers: dict[str, str]) -> bytes:
    """The whole request body, refused by its declared length first, then by what actually arrives; an
    oversized body is drained (up to ``DRAIN_BYTES``) before ``BodyTooLarge`` is raised."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    declared = headers.get("content-length", "")
    if declared and (not declared.isdigit() or int(declared) > limit):
        drainable = declared.isdigit() and int(declared) <= DRAIN_BYTES
        raise BodyTooLarge(drained=drainable and await discard_body(receive))
    message = await receive()
    if not message.get("more_body"):  # the usual case: the whole body in one message, no copy
        first = message.get("body", b"")
        if len(first) > limit:
            raise BodyTooLarge(drained=True)
        return bytes(first)
    body = bytearray(message.get("body", b""))
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit:
            more = bool(message.get("more_body"))
            raise BodyTooLarge(drained=not more or await discard_body(receive, len(body)))
        if not message.get("more_body"):
            return bytes(body)


async def discard_body(receive: Receive, received: int = 0) -> bool:
    """Read and drop the rest of the request body (``received`` bytes of it already read); True when it
    ended within ``DRAIN_BYTES`` in all, False when it went on past them or the client went away."""
    while received <= DRAIN_BYTES:
        message = await receive()
        if message.get("type") != "http.request":
            return False
        received += len(message.get("body", b""))
        if not message.get("more_body"):
            return received <= DRAIN_BYTES
    return False


async def drain_unread_body(receive: Receive, headers: dict[str, str]) -> bool:
    """For an answer that does not read the body (a refusal, an endpoint that takes none): drop any body
    the request carries, as ``read_bounded_body`` does; True when none is left unread. Free for a request
    without a body: nothing is awaited."""
    declared = headers.get("content-length", "")
    if not declared:
        return "chunked" not in headers.get("transfer-encoding", "").lower() or await discard_body(receive)
    if not declared.isdigit() or int(declared) > DRAIN_BYTES:
        return False
    return int(declared) == 0 or await discard_body(receive)
