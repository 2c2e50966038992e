"""The control plane's store, served to agents as a lean ASGI endpoint beside Django: the node
credential, ``Range`` for resumed transfers, the file handed to the socket with ``sendfile`` (ASGI's
zero-copy extension, which the web worker's protocol speaks) or, under another server, read in large
blocks off the event loop.

(Through Django's streaming responses under ASGI every block hops threads; the replication bench
measured that path at under 200 MiB/s.)"""

from __future__ import annotations

import asyncio
import hmac
import re
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async

from modelforge import auththrottle
from modelforge.errors import codes
from modelforge.http_protocol import ZERO_COPY
from modelforge.lean import Receive, Send, correlate, drain_unread_body, refuse, request_headers

PREFIX = "/api/v1/agent/artifacts/"
ROUTE = re.compile(r"^/api/v1/agent/artifacts/(\d+)/files/(.+)$")
RANGE = re.compile(r"^bytes=(\d+)-$")
CHUNK = 8 << 20


def _lookup(presented: str, pk: int, path: str) -> tuple[str | None, Path | None]:
    """(refusal, file): the node by its credential, the file of a ready artifact."""
    from django.db import close_old_connections

    from apps.artifacts.models import Artifact, ArtifactState
    from apps.nodes.models import Node, digest

    try:
        wanted = digest(presented) if presented else ""
        node = Node.objects.filter(credential_hash=wanted).only("credential_hash").first() if wanted else None
        if node is None or not hmac.compare_digest(node.credential_hash, wanted):
            return "NODE_CREDENTIAL_INVALID", None
        artifact = Artifact.objects.filter(pk=pk, state=ArtifactState.READY).first()
        if artifact is None or path not in {f["path"] for f in artifact.files}:
            return "NOT_FOUND", None
        return None, Path(artifact.store_path) / path
    finally:
        close_old_connections()


async def serve(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    headers = request_headers(scope)
    correlation_id = correlate(headers)
    match = ROUTE.match(scope["path"])
    scheme, _, presented = headers.get("authorization", "").partition(" ")
    presented = presented.strip() if scheme.lower() == "bearer" else ""
    refusal, file_path = (
        await sync_to_async(_lookup, thread_sensitive=False)(presented, int(match.group(1)), match.group(2))
        if match and scope["method"] == "GET"
        else ("NOT_FOUND", None)
    )
    if refusal or file_path is None:
        status = 401 if refusal == "NODE_CREDENTIAL_INVALID" else 404
        message = (
            "A node credential is required to fetch artifact files."
            if status == 401
            else "No such file of a ready artifact."
        )
        extra = {"www-authenticate": 'Bearer realm="modelforge-agent"'} if status == 401 else {}
        if status == 401 and presented:  # an invalid credential counts; a valid node is never held up
            source = auththrottle.scope_source(scope)
            retry_after = await auththrottle.throttle.afailed(auththrottle.AGENT, source)
            if retry_after is not None:
                blocked = auththrottle.refusal(auththrottle.NODE_CREDENTIAL, source, retry_after)
                status, refusal, message = blocked.status, blocked.code, blocked.message
                extra = {"retry-after": str(retry_after)}
        # A body sent here (nothing here takes one) is dropped first: a client still writing it reads the
        # refusal instead of a reset (modelforge.lean); past the bound, the connection closes.
        if not await drain_unread_body(receive, headers):
            extra["connection"] = "close"
        await refuse(send, status, str(refusal), message, correlation_id, extra)
        return
    size = file_path.stat().st_size
    ranged = RANGE.match(headers.get("range", ""))
    start = int(ranged.group(1)) if ranged else 0
    if ranged and start >= size:  # an empty file has no byte to start from either (RFC 9110 14.1.1)
        await refuse(
            send,
            416,
            codes.RANGE_NOT_SATISFIABLE,
            f"The range starts at byte {start}; the file has {size} bytes.",
            correlation_id,
            {"content-range": f"bytes */{size}"},
        )
        return
    response_headers = [
        (b"content-type", b"application/octet-stream"),
        (b"content-length", str(size - start).encode()),
        (b"x-correlation-id", correlation_id.encode()),
    ]
    if ranged:
        response_headers.append((b"content-range", f"bytes {start}-{size - 1}/{size}".encode()))
    await send({"type": "http.response.start", "status": 206 if ranged else 200, "headers": response_headers})
    if ZERO_COPY in scope.get("extensions", {}):  # the web worker's own protocol: sendfile
        with file_path.open("rb") as reader:
            await send({"type": ZERO_COPY, "file": reader, "offset": start, "count": size - start})
        return
    loop = asyncio.get_running_loop()
    with file_path.open("rb") as reader:
        reader.seek(start)
        while True:
            block = await loop.run_in_executor(None, reader.read, CHUNK)
            if not block:
                break
            await send({"type": "http.response.body", "body": block, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
