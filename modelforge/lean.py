"""What the lean ASGI endpoints beside Django (agents' heartbeats, the serving gateway) share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


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
