"""The gateway's client to model servers: HTTP/1.1 over pooled keep-alive connections, parsed by
httptools (the parser uvicorn uses), bodies handed on chunk by chunk as they arrive.

Why not aiohttp: measured against the bench backend, aiohttp's client spent about 240 µs of CPU per
sequential POST on this machine and this client about 60 µs (docs/DECISIONS.md); the gateway's own CPU
per request is what its latency target is made of. Backends are plain ``http://host:port`` model
servers on the fleet's network, so the client does exactly that and no more: no TLS, no redirects, no
cookies, no decompression.

Failures are told apart by what reached the backend:
- ``ConnectFailed``: no connection was made (refused, unreachable, connect timeout); nothing was sent,
  so the request may go to another backend;
- ``UpstreamTimeout``: sent, but no answer (or the next chunk) within the read timeout;
- ``UpstreamBroken``: the connection ended before a whole answer.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable

import httptools

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 120.0
# At most this many connections to one backend (aiohttp's default per host, which this replaced); a
# request that finds them all busy waits for one, up to the connect timeout.
MAX_CONNECTIONS_PER_BACKEND = 256
# An idle connection is closed after this long (a backend that left the routing table leaves nothing open).
IDLE_TIMEOUT_S = 30.0
# The watchdog's checks in a row with no connection waiting before it rests (at 0.25 s each: 2 s).
WATCH_REST_AFTER = 8


def _write_if_open(transport: asyncio.Transport, data: bytes) -> None:
    if not transport.is_closing():
        transport.write(data)


class UpstreamError(Exception):
    """The backend could not be used for this request."""


class ConnectFailed(UpstreamError):
    """No connection to the backend: nothing was sent."""


class UpstreamTimeout(UpstreamError):
    """The backend did not answer (or send the next chunk) in time."""


class UpstreamBroken(UpstreamError):
    """The connection ended before the whole answer arrived."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    __slots__ = (
        "chunks",
        "closed",
        "complete",
        "content_type",
        "deadline",
        "error",
        "head_done",
        "idle_since",
        "keep_alive",
        "loop",
        "on_body",
        "on_lost",
        "parser",
        "received_any",
        "status",
        "transport",
        "waiter",
        "waiting",
        "watch",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_lost: Callable[[], None] | None = None,
        waiting: set[_Connection] | None = None,
        watch: Callable[[], None] | None = None,
    ) -> None:
        self.loop = loop
        self.on_lost = on_lost
        # The pool's set of connections waiting for the backend: its watchdog times them out (``watch``
        # starts it again when the set was empty: it rests while nothing waits).
        self.waiting: set[_Connection] = waiting if waiting is not None else set()
        self.watch = watch
        self.deadline = 0.0
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        # The body's pieces, one deque for the connection's life. httptools calls ``on_body`` once per piece
        # (a chunked stream of 21 events: 21 calls); the deque's own ``append`` takes them without a
        # Python call each.
        self.chunks: collections.deque[bytes] = collections.deque()
        self.on_body = self.chunks.append
        # One parser for the connection's life: llhttp starts the next message after each complete one.
        # (It reads the callbacks, ``on_body`` among them, once, here.)
        self.parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = b""
        self.chunks.clear()
        self.head_done = False
        self.keep_alive = False
        self.complete = False
        self.received_any = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = UpstreamBroken(f"the backend's answer is not valid HTTP ({exc})")
            self._close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.on_lost is not None:
            on_lost, self.on_lost = self.on_lost, None
            on_lost()
        if not self.complete and self.error is None:
            self.error = UpstreamBroken("the backend closed the connection before a whole answer")
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 12 and name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Asked here: llhttp answers it from the head; after the message it no longer says yes.
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True

    def on_message_complete(self) -> None:
        self.complete = True

    # ours
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def wait(self, timeout: float) -> None:
        """Until something new arrived (head, a chunk, the end) or failed; raises on failure/timeout."""
        if self.error is not None:
            raise self.error
        # No timer per wait (call_later + cancel measured 2 µs, a share of the gateway's per-request
        # CPU): a deadline, which the pool's watchdog checks a few times a second.
        self.waiter = self.loop.create_future()
        self.deadline = self.loop.time() + timeout
        if not self.waiting and self.watch is not None:
            self.watch()
        self.waiting.add(self)
        try:
            await self.waiter
        finally:
            self.waiting.discard(self)
            self.waiter = None
        if self.error is not None:
            raise self.error

    def _timed_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            self.error = UpstreamTimeout("the backend did not answer in time")
            self._close()
            waiter.set_result(None)


class UpstreamResponse:
    """An answer whose head has arrived; the body follows through ``chunks()`` or ``read()``."""

    __slots__ = ("_conn", "_key", "_pool", "_released", "status")

    def __init__(self, pool: Upstream, key: tuple[str, int], conn: _Connection) -> None:
        self._pool, self._key, self._conn = pool, key, conn
        self.status = conn.status
        self._released = False

    def content_type(self, default: bytes = b"application/json") -> bytes:
        return self._conn.content_type or default

    @property
    def complete(self) -> bool:
        """The whole body has arrived (a small answer usually arrives with its head)."""
        return self._conn.complete

    def take_available(self) -> bytes:
        """Whatever body has arrived so far, joined."""
        chunks = self._conn.chunks
        if len(chunks) == 1:
            return chunks.popleft()
        data = b"".join(chunks)
        chunks.clear()
        return data

    async def gather(self, at_most: int) -> None:
        """Wait for the rest of the body, unless more than ``at_most`` bytes of it have arrived (then
        ``chunks()`` passes on what has, and the rest as it comes)."""
        conn = self._conn
        while not conn.complete and sum(len(chunk) for chunk in conn.chunks) <= at_most:
            await conn.wait(self._pool.read_timeout)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, never buffered whole: each piece is what has arrived since the last
        one, joined. A backend's stream sends an event per HTTP chunk, and several usually come in one read
        (the bench's 21 events in two or three): handed on one by one, each cost the gateway a send to the
        client and a pass of the model renamer, about a tenth of a streamed request's CPU at one connection
        (bench/gateway/README.md, 2026-12-06 (late night)). Nothing waits for more to arrive."""
        conn = self._conn
        while True:
            if conn.chunks:
                yield self.take_available()
            elif conn.complete:
                return
            else:
                await conn.wait(self._pool.read_timeout)

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.chunks()]
        return b"".join(parts)

    def release(self) -> None:
        """Hand the connection back (kept alive only after a whole answer that allows it)."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.complete and not conn.closed and conn.keep_alive:
            self._pool._give_back(self._key, conn)
        else:
            conn._close()


class Upstream:
    """Keep-alive connections per backend, made in the serving loop on first use."""

    def __init__(
        self, connect_timeout: float = CONNECT_TIMEOUT_S, read_timeout: float = READ_TIMEOUT_S
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: dict[tuple[str, int], int] = {}
        self._waiters: dict[tuple[str, int], collections.deque[asyncio.Future[_Connection | None]]] = {}
        self._pruned_at = 0.0
        self._waiting: set[_Connection] = set()
        self._watchdog: asyncio.Task[None] | None = None

    async def post(
        self, url: str, path: str, body: bytes, headers: list[tuple[str, str]]
    ) -> UpstreamResponse:
        """POST ``body`` to ``url`` (``http://host:port``) + ``path``; returns once the head arrived."""
        key = _host_port(url)
        now = time.monotonic()
        if now - self._pruned_at > IDLE_TIMEOUT_S / 3:
            self._prune(now)
        start = _request_lines.get((key, path))
        if start is None:
            start = _request_lines[(key, path)] = (
                f"POST {path} HTTP/1.1\r\nHost: {key[0]}:{key[1]}\r\n".encode()
            )
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers]) if headers else ""
        request = b"%sContent-Length: %d\r\n%s\r\n%s" % (start, len(body), lines.encode("latin-1"), body)
        conn = self._take_idle(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, request)
            except UpstreamBroken:
                if conn.received_any:
                    raise
                # A kept-alive connection the backend had already closed: nothing of ours was read
                # (no byte came back); one fresh connection, once.
        conn = await self._acquire(key)
        return await self._exchange(key, conn, request)

    async def _acquire(self, key: tuple[str, int]) -> _Connection:
        """An idle connection, a new one while under the cap, or the next one handed back."""
        conn = self._take_idle(key)
        if conn is not None:
            return conn
        if self._open.get(key, 0) < MAX_CONNECTIONS_PER_BACKEND:
            return await self._connect(key)
        waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, collections.deque()).append(waiter)
        try:
            handed = await asyncio.wait_for(waiter, self.connect_timeout)
        except TimeoutError:
            raise ConnectFailed(
                f"all {MAX_CONNECTIONS_PER_BACKEND} connections to {key[0]}:{key[1]} stayed busy"
            ) from None
        if handed is None:  # one closed: room for a new one
            return await self._connect(key)
        handed._reset()
        return handed

    async def _exchange(self, key: tuple[str, int], conn: _Connection, request: bytes) -> UpstreamResponse:
        assert conn.transport is not None
        # Written at the end of this turn of the loop rather than at once: requests that arrived together
        # are all read and routed before the first one wakes a backend sharing the core (the gateway
        # bench measured a few µs less CPU per request). A connection lost meanwhile is seen by ``wait``.
        # The connection's own loop: asyncio.get_running_loop() makes a getpid system call on CPython 3.11.
        conn.loop.call_soon(_write_if_open, conn.transport, request)
        try:
            while not conn.head_done:
                await conn.wait(self.read_timeout)
        except UpstreamError:
            conn._close()
            raise
        return UpstreamResponse(self, key, conn)

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        # The slot is taken before the connection exists, so concurrent requests never overshoot the cap.
        self._open[key] = self._open.get(key, 0) + 1
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop, lambda: self._lost(key), self._waiting, self._start_watch),
                    key[0],
                    key[1],
                ),
                self.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            self._lost(key)
            raise ConnectFailed(f"no connection to {key[0]}:{key[1]} ({type(exc).__name__})") from None
        except BaseException:
            self._lost(key)
            raise
        return conn

    def _lost(self, key: tuple[str, int]) -> None:
        """A connection to ``key`` closed: one fewer open, and a waiting request may make a new one."""
        self._open[key] = max(0, self._open.get(key, 0) - 1)
        self._hand_to_waiter(key, None)

    def _hand_to_waiter(self, key: tuple[str, int], handed: _Connection | None) -> bool:
        """Give the first request still waiting for ``key`` a connection (or, with None, room to make
        one); False when nobody waits."""
        waiters = self._waiters.get(key)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(handed)
                return True
        return False

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                conn._reset()
                return conn
        return None

    def _start_watch(self) -> None:
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Time out connections waiting past their deadline (checked a few times a second). After
        ``WATCH_REST_AFTER`` checks in a row with nothing waiting it rests, until a connection waits again
        (``_Connection.wait``): an idle gateway's loop then has no reason to wake (bench/gateway/idle.py)."""
        loop = asyncio.get_running_loop()
        interval = min(0.25, self.read_timeout / 4, self.connect_timeout / 4)
        quiet = 0
        while True:
            await asyncio.sleep(interval)
            if not self._waiting:
                quiet += 1
                if quiet >= WATCH_REST_AFTER:
                    self._watchdog = None
                    return
                continue
            quiet = 0
            now = loop.time()
            for conn in [c for c in self._waiting if c.deadline <= now]:
                if conn.waiter is not None:
                    conn._timed_out(conn.waiter)

    def _prune(self, now: float) -> None:
        """Close connections idle for longer than IDLE_TIMEOUT_S (the oldest sit first in each list)."""
        self._pruned_at = now
        for idle in self._idle.values():
            while idle and now - idle[0].idle_since > IDLE_TIMEOUT_S:
                idle.pop(0)._close()

    def _give_back(self, key: tuple[str, int], conn: _Connection) -> None:
        if self._hand_to_waiter(key, conn):  # straight to a request waiting for one
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(key, []).append(conn)

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for idle in self._idle.values():
            for conn in idle:
                conn._close()
        self._idle.clear()


_parsed_urls: dict[str, tuple[str, int]] = {}
_request_lines: dict[tuple[tuple[str, int], str], bytes] = {}


def _host_port(url: str) -> tuple[str, int]:
    found = _parsed_urls.get(url)
    if found is None:
        found = _parsed_urls[url] = _parse_host_port(url)
    return found


def _parse_host_port(url: str) -> tuple[str, int]:
    scheme, _, rest = url.partition("://")
    if scheme != "http" or not rest:
        raise ConnectFailed(f"not an http://host:port backend URL: {url!r}")
    host, _, port = rest.split("/", 1)[0].rpartition(":")
    if not host:
        return rest.split("/", 1)[0], 80
    return host.strip("[]"), int(port)
