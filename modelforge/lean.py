"""What the lean ASGI endpoints beside Django (agents' heartbeats, the serving gateway) share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    """The request body is over MODELFORGE_MAX_REQUEST_BYTES (declared or actual)."""


async def read_bounded_body(receive: Receive, headers: dict[str, str]) -> bytes:
    """The whole request body, refused by its declared length first, then by what actually arrives."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    declared = headers.get("content-length", "")
    if declared and (not declared.isdigit() or int(declared) > limit):
        raise BodyTooLarge
    message = await receive()
    if not message.get("more_body"):  # the usual case: the whole body in one message, no copy
        first = message.get("body", b"")
        if len(first) > limit:
            raise BodyTooLarge
        return bytes(first)
    body = bytearray(message.get("body", b""))
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge
        if not message.get("more_body"):
            return bytes(body)
