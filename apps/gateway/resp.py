"""A lean Redis client for the gateway's hot path: one connection per process, commands pipelined on it
in order (Redis answers in order), replies parsed as they arrive. Only what the limit script needs.

redis-py's asyncio client costs about 220 µs of CPU per command here (bench/gateway, ``--limits``), a
multiple of the gateway's own cost per request; this one is a protocol on the event loop, as the
upstream HTTP client is (apps/gateway/upstream.py). Plain ``redis://`` URLs only; anything else
(TLS, unix sockets) uses redis-py (``LeanRedis.supports``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

TIMEOUT_S = 0.5
# [0]: the admission script's usual reply (apps/gateway/limits.py), read without the parser.
ADMITTED = b"*1\r\n:0\r\n"


class RespError(Exception):
    """Redis answered with an error reply (``-ERR ...``, ``-NOSCRIPT ...``)."""


class RespUnavailable(ConnectionError):
    """No answer: not connected, the connection was lost, or the reply did not come in time."""


class RespConnectionLost(RespUnavailable):
    """The connection ended under the command (Redis restarted, the connection was cut): a new
    connection may well answer, unlike a reply that did not come in time."""


def encode(*parts: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse(buffer: bytes | bytearray, at: int = 0) -> tuple[Any, int] | None:
    """One reply from ``buffer`` at ``at``: (the reply, where the next starts), or None if incomplete.
    An error reply is returned as a ``RespError`` (not raised)."""
    end = buffer.find(b"\r\n", at)
    if end < 0:
        return None
    kind, line = buffer[at : at + 1], bytes(buffer[at + 1 : end])
    after = end + 2
    if kind == b"+":
        return line, after
    if kind == b"-":
        return RespError(line.decode(errors="replace")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            return None
        return bytes(buffer[after : after + size]), after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            found = parse(buffer, after)
            if found is None:
                return None
            item, after = found
            items.append(item)
        return items, after
    raise RespUnavailable(f"not a RESP reply: {bytes(buffer[at : at + 20])!r}")


class _Protocol(asyncio.Protocol):
    """The connection: commands written at the end of the loop's turn (those of one turn leave in one
    system call), replies handed to their waiters in order. One watchdog, not a timer per command: a
    reply later than ``timeout`` after its command fails the connection."""

    def __init__(self, timeout: float = TIMEOUT_S) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.timeout = timeout
        # A waiter per command sent, in order; None: a reply nobody waits for (``LeanRedis.fire``).
        self.pending: collections.deque[asyncio.Future[Any] | None] = collections.deque()
        self.sent_at: collections.deque[float] = collections.deque()
        self.out: list[bytes | Callable[[], bytes]] = []  # a callable: built as it leaves
        self.scheduled = False  # a flush at the end of this turn
        self.delayed: asyncio.TimerHandle | None = None  # a flush in a moment (``send``'s ``within``)
        self.watchdog: asyncio.TimerHandle | None = None
        self.buffer = bytearray()
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, data: bytes, waiter: asyncio.Future[Any] | None, within: float = 0.0) -> None:
        """Queue one encoded command; its reply goes to ``waiter`` (None: dropped). It leaves at the end
        of the loop's turn, or with ``within`` (seconds) with the next command sent, at the latest
        ``within`` from now."""
        now = self.loop.time()
        self.pending.append(waiter)
        self.sent_at.append(now)
        self.out.append(data)
        if not within:
            if not self.scheduled:
                self.scheduled = True
                self.loop.call_soon(self._flush)
        elif not self.scheduled and (self.delayed is None or now + within < self.delayed.when()):
            if self.delayed is not None:
                self.delayed.cancel()
            self.delayed = self.loop.call_at(now + within, self._flush_delayed)
        if self.watchdog is None:
            self.watchdog = self.loop.call_at(now + self.timeout, self._watch)

    def send_built(self, build: Callable[[], bytes], waiter: asyncio.Future[Any]) -> None:
        """Queue one command whose bytes ``build`` makes as it leaves, at the end of the loop's turn:
        what the rest of the turn adds to it goes too (apps/gateway/limits.py's batch of admissions)."""
        self.pending.append(waiter)
        self.sent_at.append(self.loop.time())
        self.out.append(build)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)
        if self.watchdog is None:
            self.watchdog = self.loop.call_at(self.loop.time() + self.timeout, self._watch)

    def _flush_delayed(self) -> None:
        self.delayed = None
        self._flush()

    def _flush(self) -> None:
        self.scheduled = False
        if self.delayed is not None:  # what it waited to send leaves now
            self.delayed.cancel()
            self.delayed = None
        if not self.out or self.lost or self.transport is None:
            self.out.clear()
            return
        out = [part if isinstance(part, bytes) else part() for part in self.out]
        self.out.clear()
        data = out[0] if len(out) == 1 else b"".join(out)
        self.transport.write(data)

    def _watch(self) -> None:
        self.watchdog = None
        if not self.sent_at or self.lost:
            return
        # A reply late past the timeout would be taken for the next command's: the connection is dropped.
        deadline = self.sent_at[0] + self.timeout
        if self.loop.time() >= deadline:
            self._fail(RespUnavailable(f"no reply within {self.timeout} s"))
        else:
            self.watchdog = self.loop.call_at(deadline, self._watch)

    def data_received(self, data: bytes) -> None:
        if self.buffer:
            self.buffer += data
            buffer: bytes | bytearray = self.buffer
        else:
            buffer = data
        at, size = 0, len(buffer)
        pending, sent_at = self.pending, self.sent_at
        while pending and at < size:
            # The usual replies, without the general parser: the admission script's "admitted", an integer.
            if buffer.startswith(ADMITTED, at):
                reply: Any = [0]
                at += len(ADMITTED)
            else:
                try:
                    found = parse(buffer, at)
                except (RespUnavailable, ValueError) as exc:
                    self._fail(RespUnavailable(str(exc)))
                    return
                if found is None:
                    break
                reply, at = found
            waiter = pending.popleft()
            sent_at.popleft()
            if waiter is not None and not waiter.done():
                waiter.set_result(reply)
        if buffer is self.buffer:
            del self.buffer[:at]
        elif at < size:
            self.buffer += buffer[at:]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RespConnectionLost(f"connection lost ({exc})" if exc else "connection closed"))

    def _fail(self, error: Exception) -> None:
        self.lost = True
        self.out.clear()
        self.sent_at.clear()
        while self.pending:
            waiter = self.pending.popleft()
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()


class LeanRedis:
    """One pipelined connection to a plain ``redis://`` server, made on first use and again after a loss."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 6379
        self.password = unquote(parts.password) if parts.password else None
        self.username = unquote(parts.username) if parts.username else None
        self.db = int(parts.path.lstrip("/") or 0) if parts.path.lstrip("/").isdigit() else 0
        self.timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self._fired: set[asyncio.Future[None]] = set()

    @staticmethod
    def supports(url: str) -> bool:
        return urlsplit(url).scheme == "redis"

    def ready(self) -> _Protocol | None:
        """The connection when it is up (the hot path's check, no coroutine); None: ``_connection``."""
        protocol = self._protocol
        return protocol if protocol is not None and not protocol.lost else None

    def pipeline(self) -> Pipeline:
        return Pipeline(self)

    async def connection(self) -> _Protocol:
        """The connection, made on this event loop (one made on a loop that has since closed, as a
        test's, is dropped, not waited on for ever)."""
        protocol = self._protocol
        if protocol is not None and protocol.loop is not asyncio.get_running_loop():
            self._protocol = self._connecting = None
        return await self._connection()

    async def _connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.lost:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        timeout = self.timeout
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(timeout), self.host, self.port), timeout
            )
        except (TimeoutError, OSError) as exc:
            raise RespUnavailable(f"cannot connect to {self.host}:{self.port} ({exc})") from None
        self._protocol = protocol
        if self.password is not None:
            auth = ("AUTH", self.username, self.password) if self.username else ("AUTH", self.password)
            await self._checked(protocol, *auth)
        if self.db:
            await self._checked(protocol, "SELECT", self.db)
        return protocol

    async def _checked(self, protocol: _Protocol, *command: Any) -> Any:
        reply = await self._send(protocol, encode(*command))
        if isinstance(reply, RespError):
            raise RespUnavailable(f"{command[0]} refused: {reply}")
        return reply

    @staticmethod
    def _send(protocol: _Protocol, data: bytes) -> asyncio.Future[Any]:
        waiter: asyncio.Future[Any] = protocol.loop.create_future()
        protocol.send(data, waiter)
        return waiter

    async def command(self, *command: Any) -> Any:
        """One command's reply; ``RespError`` for an error reply, ``RespUnavailable`` when none came."""
        reply = await self._send(await self._connection(), encode(*command))
        if isinstance(reply, RespError):
            raise reply
        return reply

    def fire(self, command: bytes, within: float = 0.0) -> None:
        """Send one encoded command (``encode``) whose reply nobody awaits: no waiter, no timer. Sent
        in order with the others on the connection, with the next one sent if that comes ``within``
        seconds (one system call for both), else alone; lost with the connection (the caller accepts
        that)."""
        protocol = self.ready()
        if protocol is not None:
            protocol.send(command, None, within)
            return
        task = asyncio.ensure_future(self._fire_when_connected(command))
        self._fired.add(task)
        task.add_done_callback(self._fired.discard)

    async def _fire_when_connected(self, command: bytes) -> None:
        with contextlib.suppress(RespUnavailable, OSError):
            (await self._connection()).send(command, None)

    async def evalsha(self, sha: str, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` by its digest, loading it once when the server does not have it (NOSCRIPT)."""
        return await self.run_script(encode("EVALSHA", sha, len(keys), *keys, *args), script)

    async def run_script(self, evalsha: bytes, script: str) -> Any:
        """``evalsha``, an encoded ``EVALSHA`` of ``script``: its reply; the script loaded first when the
        server lacks it (NOSCRIPT), then the same command again."""
        protocol = self.ready() or await self._connection()
        reply = await self._send(protocol, evalsha)
        if isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT"):
            await self.command("SCRIPT", "LOAD", script)
            reply = await self._send(await self._connection(), evalsha)
        if isinstance(reply, RespError):
            raise reply
        return reply


class Pipeline:
    """Commands queued, then sent in one write with their replies awaited together (``execute``): the
    part of redis-py's asyncio pipeline that the load-balancer state's once-a-second flush uses
    (apps/gateway/lbstate.py), replies shaped as redis-py shapes them (``HGETALL``: a dict, ``EXPIRE``: a
    bool). redis-py's pipeline spent about 1.8 ms of CPU on an idle process's flush, half of the
    serving loop's own CPU while nothing is served (bench/gateway/idle.py, 2026-12-04).

    An error reply raises ``RespError`` from ``execute`` (the first one, after every reply has arrived);
    no reply raises ``RespUnavailable`` (an ``OSError``)."""

    def __init__(self, lean: LeanRedis) -> None:
        self.lean = lean
        self.commands: list[bytes] = []
        self.shapes: list[Callable[[Any], Any] | None] = []

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.commands.clear()
        self.shapes.clear()

    def _add(self, shape: Callable[[Any], Any] | None, *parts: bytes | str | int | float) -> None:
        self.commands.append(encode(*(repr(p) if isinstance(p, float) else p for p in parts)))
        self.shapes.append(shape)

    def ping(self) -> None:
        self._add(None, "PING")

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> None:
        self._add(None, "EVAL", script, numkeys, *keys_and_args)

    def hincrby(self, name: str, key: str | bytes, amount: int = 1) -> None:
        self._add(None, "HINCRBY", name, key, amount)

    def incrby(self, name: str, amount: int = 1) -> None:
        self._add(None, "INCRBY", name, amount)

    def expire(self, name: str, seconds: int) -> None:
        self._add(bool, "EXPIRE", name, int(seconds))

    def delete(self, *names: str) -> None:
        self._add(None, "DEL", *names)

    def hset(
        self, name: str, key: str | None = None, value: Any = None, mapping: dict[Any, Any] | None = None
    ) -> None:
        pairs: list[Any] = [] if key is None else [key, value]
        for field, item in (mapping or {}).items():
            pairs.extend((field, item))
        self._add(None, "HSET", name, *pairs)

    def hdel(self, name: str, *keys: str) -> None:
        self._add(None, "HDEL", name, *keys)

    def zadd(self, name: str, mapping: dict[str, float]) -> None:
        parts: list[Any] = []
        for member, score in mapping.items():
            parts.extend((score, member))
        self._add(None, "ZADD", name, *parts)

    def zremrangebyscore(self, name: str, low: float, high: float) -> None:
        self._add(None, "ZREMRANGEBYSCORE", name, low, high)

    def zrange(self, name: str, start: int, end: int) -> None:
        self._add(None, "ZRANGE", name, start, end)

    def hgetall(self, name: str) -> None:
        self._add(_as_dict, "HGETALL", name)

    def hmget(self, name: str, keys: list[str]) -> None:
        self._add(None, "HMGET", name, *keys)

    async def execute(self) -> list[Any]:
        commands, shapes = self.commands, self.shapes
        self.commands, self.shapes = [], []
        if not commands:
            return []
        protocol = await self.lean.connection()
        waiters = []
        for command in commands:
            waiter: asyncio.Future[Any] = protocol.loop.create_future()
            protocol.send(command, waiter)
            waiters.append(waiter)
        try:
            replies = [await waiter for waiter in waiters]
        except BaseException:
            # A lost or silent connection fails every waiter together: the first's error is raised, the
            # others' are taken here, else each is logged as "Future exception was never retrieved" (a
            # traceback per command of every flush while Redis is frozen).
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()
                elif not waiter.cancelled():
                    waiter.exception()
            raise
        for reply in replies:
            if isinstance(reply, RespError):
                raise reply
        return [
            reply if shape is None else shape(reply) for reply, shape in zip(replies, shapes, strict=True)
        ]


def _as_dict(reply: list[Any]) -> dict[Any, Any]:
    return dict(zip(reply[::2], reply[1::2], strict=True))
