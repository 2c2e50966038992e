"""uvicorn's httptools protocol, with a response's writes coalesced into one system call.

uvicorn writes a response's head when the application sends ``http.response.start`` and its body when
it sends ``http.response.body``: two ``send`` calls, two TCP segments, for every small response. Here the
writes made while a task runs are joined and handed to the socket once, at the end of the event loop's
turn (``call_soon``). Order is kept; ``close`` and ``write_eof`` flush first. The gateway bench measured
the second system call as a visible share of its per-request CPU (bench/gateway/README.md).

It also speaks ASGI's zero-copy send extension (``http.response.zerocopysend``): a file's bytes go from
the page cache to the socket with ``sendfile`` instead of being read into Python and written back
(the agents' artifact downloads; the replication bench measured the read-and-write path at 0.45 CPU
seconds per GiB, most of a core at the speeds replication runs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

ZERO_COPY = "http.response.zerocopysend"
logger = logging.getLogger("uvicorn.error")


class CoalescingTransport:
    """A transport whose writes within one turn of the event loop leave as one."""

    __slots__ = ("_buffer", "_loop", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._buffer.append(bytes(data))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        self._scheduled = False
        if not self._buffer:
            return
        data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
        self._buffer.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._buffer.clear()
        self._transport.abort()

    def is_closing(self) -> bool:
        # Asked once a response (uvicorn's ``on_response_complete``): a method of its own, because Python
        # reaches ``__getattr__`` only after raising and catching an AttributeError.
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(b) for b in self._buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` over a ``CoalescingTransport``, with one keep-alive timer per connection.

    uvicorn arms a timer when a response completes and cancels it when the next request's bytes arrive:
    a timer made and dropped per request. Here a connection's timer, once armed, stays: when it fires it
    closes the connection if it has been idle for the keep-alive timeout since its last response, and
    otherwise sets itself for the time left (or, busy, waits for the next response to arm it again)."""

    _idle_since: float | None = None  # (loop time) since the last response completed; None: busy
    _keep_alive_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._keep_alive_timer is not None:
            self._keep_alive_timer.cancel()
            self._keep_alive_timer = None

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # busy: the timer, if armed, finds it so and stands down

    def on_response_complete(self) -> None:
        # uvicorn's, with the timer above instead of a new one per response.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            self._idle_since = None
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self._keep_alive_timer is None:
            self._keep_alive_timer = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_check)

    def _keep_alive_check(self) -> None:
        self._keep_alive_timer = None
        if self._idle_since is None or self.transport.is_closing():
            return
        left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self._keep_alive_timer = self.loop.call_later(left, self._keep_alive_check)
        else:
            self.timeout_keep_alive_handler()

    def on_headers_complete(self) -> None:
        handler = _lean_handler(self)
        if handler is not None:
            lean: Any = LeanCycle(self, handler)  # uvicorn's protocol drives it as its own cycle
            existing, self.cycle = self.cycle, lean
            if existing is None or existing.response_complete:
                self._start_asgi_task(lean, handler)
            else:  # pipelined: after the answer before it, as uvicorn does
                self.flow.pause_reading()
                self.pipeline.appendleft((lean, handler))
            return
        super().on_headers_complete()
        cycle = self.cycle
        # Only a GET answers with a file; other requests keep uvicorn's own send (one call less each).
        if cycle is not None and cycle.scope["method"] == "GET" and not getattr(cycle, "zero_copy", False):
            cycle.zero_copy = True  # type: ignore[attr-defined]
            cycle.scope.setdefault("extensions", {})[ZERO_COPY] = {}
            cycle.send = ZeroCopySend(cycle, self.loop)  # type: ignore[method-assign]


SENDFILE_THREADS = 8
_pool: ThreadPoolExecutor | None = None


def _sendfile_threads() -> ThreadPoolExecutor:
    """Threads of their own: a transfer holds one for as long as it runs, and the loop's default
    executor also serves ``sync_to_async`` (the store endpoint's own credential lookup among them).
    Transfers beyond ``SENDFILE_THREADS`` at once wait for a free thread."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=SENDFILE_THREADS, thread_name_prefix="sendfile")
    return _pool


class ZeroCopySend:
    """``send`` for one request: ``http.response.zerocopysend`` messages (``file``: a binary file object,
    ``offset``, ``count``, ``more_body``) go out with ``os.sendfile``; every other message to uvicorn.

    The response must have started with a ``content-length``. ``sendfile`` runs on a thread with a
    duplicate of the socket's descriptor (uvloop, the worker's loop, has no ``loop.sendfile``; the
    duplicate keeps the descriptor from being reused should the loop close the connection meanwhile). The
    loop writes nothing else to the connection until it returns. A client that goes away mid-file, or
    reads nothing for ``STALL`` seconds, ends the response quietly, as uvicorn does for a body written to a
    closed connection. Over TLS (no plain socket) the file is read and written in blocks instead.
    """

    __slots__ = ("_cycle", "_loop", "_send")

    STALL = 60.0
    BLOCK = 8 << 20

    def __init__(self, cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop) -> None:
        self._cycle = cycle
        self._loop = loop
        self._send = RequestResponseCycle.send.__get__(cycle)

    async def __call__(self, message: Any) -> None:
        if message["type"] != ZERO_COPY:
            await self._send(message)
            return
        cycle = self._cycle
        if not cycle.response_started or cycle.response_complete or cycle.chunked_encoding is not False:
            raise RuntimeError(f"{ZERO_COPY} needs a started response with a content-length")
        file = message["file"]
        offset = int(message.get("offset", 0))
        count = message.get("count")
        count = cycle.expected_content_length if count is None else int(count)
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        transport = cycle.transport
        if isinstance(transport, CoalescingTransport):
            transport.flush()
            transport = transport._transport
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            await self._copy_in_blocks(file, offset, count, message.get("more_body", False))
            return
        while transport.get_write_buffer_size() and not cycle.disconnected:
            await asyncio.sleep(0.001)  # the head has not left yet (rare: it is small)
        if cycle.disconnected:
            return
        descriptor = os.dup(sock.fileno())
        try:
            sent = await self._loop.run_in_executor(
                _sendfile_threads(), self._sendfile, descriptor, file.fileno(), offset, count
            )
        finally:
            os.close(descriptor)
        if sent < count:  # the client went away or stopped reading
            cycle.disconnected = True
            cycle.transport.close()
            return
        cycle.expected_content_length -= sent
        if not message.get("more_body", False):
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    def _sendfile(self, out_fd: int, in_fd: int, offset: int, count: int) -> int:
        """Bytes sent: ``count``, or fewer when the client went away or stalled."""
        sent = 0
        poller = select.poll()
        poller.register(out_fd, select.POLLOUT)
        while sent < count and not self._cycle.disconnected:
            try:
                done = os.sendfile(out_fd, in_fd, offset + sent, min(self.BLOCK, count - sent))
            except BlockingIOError:
                if not poller.poll(self.STALL * 1000):
                    return sent
                continue
            except OSError:  # reset, broken pipe
                return sent
            if done == 0:  # the file is shorter than promised
                raise RuntimeError("the file ended before the response's content-length")
            sent += done
        return sent

    async def _copy_in_blocks(self, file: Any, offset: int, count: int, more_body: bool) -> None:
        file.seek(offset)
        while count:
            block = await self._loop.run_in_executor(None, file.read, min(self.BLOCK, count))
            if not block:
                raise RuntimeError("the file ended before the response's content-length")
            count -= len(block)
            more = bool(count) or more_body
            await self._send({"type": "http.response.body", "body": block, "more_body": more})


_LEAN: tuple[dict[str, Any], tuple[tuple[str, Any], ...], Any] | None = None


def handler_for(path: str, exact: dict[str, Any], prefixes: tuple[tuple[str, Any], ...]) -> Any:
    """The lean endpoint ``modelforge.lean.routes()``'s table mounts at ``path`` (an exact path first,
    then the longest prefix), or None. Here, beside the protocol that dispatches a plain POST with it,
    rather than in modelforge.lean: this module is loaded before Django is set up; the entry point
    (modelforge.asgi) dispatches the other requests with it."""
    handler = exact.get(path)
    if handler is None:
        for prefix, candidate in prefixes:
            if path.startswith(prefix):
                return candidate
    return handler


def _lean_handler(protocol: HttpToolsProtocol) -> Any:
    """The lean endpoint (modelforge.lean) a plain POST goes to, or None: uvicorn's own cycle then."""
    global _LEAN
    parser = protocol.parser
    url = protocol.url
    if (
        parser.get_method() != b"POST"
        or protocol.expect_100_continue
        or url[:1] != b"/"
        # ``find``, not ``in``: on Python 3.11 ``bytes in bytes`` first tries its operand as an integer and
        # raises and clears a TypeError (about 1,900 instructions; bench/gateway/instructions.py).
        or url.find(b"?") >= 0
        or url.find(b"%") >= 0
        or url.find(b"#") >= 0
        or protocol.root_path
        or protocol.limit_concurrency is not None
        or parser.should_upgrade()
        or parser.get_http_version() != "1.1"
    ):
        return None
    if _LEAN is None:
        from modelforge import asgi

        _LEAN = (asgi.EXACT, asgi.PREFIXES, asgi.TRUSTED)
    path = url.decode("ascii")
    handler = handler_for(path, _LEAN[0], _LEAN[1])
    if handler is None:
        return None
    scope = protocol.scope
    scope["method"] = "POST"
    scope["path"] = path
    scope["raw_path"] = url
    scope["query_string"] = b""
    if _LEAN[2] is not None:  # behind a trusted proxy: the client it names, as modelforge.asgi does
        _LEAN[2].resolve(scope)  # type: ignore[arg-type]
    return handler


class LeanCycle:
    """One request to a lean endpoint: uvicorn's ``RequestResponseCycle`` for what the gateway and the
    heartbeats use, without what they do not (the proxy-headers middleware, the entry point's dispatch,
    an ``asyncio.Event`` per request, two expressions per response header)."""

    __slots__ = (
        "body",
        "chunked",
        "delivered",
        "disconnected",
        "flow",
        "handler",
        "keep_alive",
        "left",
        "more_body",
        "on_response",
        "response_complete",
        "response_started",
        "scope",
        "server_state",
        "transport",
        "waiter",
    )

    def __init__(self, protocol: HttpToolsProtocol, handler: Any) -> None:
        self.scope = protocol.scope
        self.transport = protocol.transport
        self.flow: FlowControl = protocol.flow
        self.handler = handler
        self.on_response = protocol.on_response_complete
        self.server_state = protocol.server_state
        self.keep_alive = protocol.parser.should_keep_alive()
        self.disconnected = False
        self.body = bytearray()
        self.more_body = True
        self.delivered = False
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.left = 0
        self.waiter: asyncio.Future[None] | None = None

    @property
    def message_event(self) -> LeanCycle:
        return self

    def set(self) -> None:
        """uvicorn's protocol: more body, the end of it, or the connection gone."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def run_asgi(self, _app: Any) -> None:
        try:
            await self.handler(self.scope, self.receive, self.send)
        except BaseException as exc:
            logger.error("Exception in ASGI application", exc_info=exc)
            if not self.response_started:
                await self.send(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await self.send({"type": "http.response.body", "body": b"Internal Server Error"})
            else:
                self.transport.close()
        else:
            if not self.response_complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def receive(self) -> dict[str, Any]:
        while not (self.disconnected or self.response_complete):
            if self.body or not (self.more_body or self.delivered):
                body, self.body = bytes(self.body), bytearray()
                self.delivered = not self.more_body
                return {"type": "http.request", "body": body, "more_body": self.more_body}
            # More body to come, or (all of it read) the client going away.
            self.flow.resume_reading()
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected 'http.response.start', got '{message['type']}'.")
            self.response_started = True
            headers = message.get("headers", ())
            names = b"".join(name for name, _ in headers)
            if HEADER_RE.search(names) or HEADER_VALUE_RE.search(b"".join(value for _, value in headers)):
                raise RuntimeError("Invalid HTTP header.")
            content = [STATUS_LINE[message["status"]]]
            for name, value in self.server_state.default_headers:  # the Date header, kept by the server
                content += (name, b": ", value, b"\r\n")
            length: int | None = None
            close = False
            for name, value in headers:
                name = name.lower()
                if name == b"content-length":
                    if length is None:
                        length = int(value)
                elif name == b"transfer-encoding":
                    if value.lower() == b"chunked":
                        self.chunked = True
                elif name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
                    self.keep_alive, close = False, True
                content += (name, b": ", value, b"\r\n")
            if self.chunked:
                length = None
            elif length is None:
                self.chunked = True
                content.append(b"transfer-encoding: chunked\r\n")
            if length is not None:
                self.left = length
            if not self.keep_alive and not close:
                content.append(b"connection: close\r\n")
            content.append(b"\r\n")
            self.transport.write(b"".join(content))
            return
        if self.response_complete:
            raise RuntimeError(f"'{message['type']}' sent after the response completed.")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"Expected 'http.response.body', got '{message['type']}'.")
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        if self.chunked:
            if body:
                self.transport.write(
                    b"%x\r\n%s\r\n" % (len(body), body)
                    if more_body
                    else b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
                )
            elif not more_body:
                self.transport.write(b"0\r\n\r\n")
        else:
            self.left -= len(body)
            if self.left < 0:
                raise RuntimeError("Response content longer than Content-Length")
            self.transport.write(body)
        if not more_body:
            if self.left:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


def _nothing() -> None:
    return None
