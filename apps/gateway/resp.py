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
from typing import Any
from urllib.parse import unquote, urlsplit

TIMEOUT_S = 0.5


class RespError(Exception):
    """Redis answered with an error reply (``-ERR ...``, ``-NOSCRIPT ...``)."""


class RespUnavailable(ConnectionError):
    """No answer: not connected, the connection was lost, or the reply did not come in time."""


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
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.buffer = bytearray()
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        at = 0
        while self.pending:
            try:
                found = parse(self.buffer, at)
            except (RespUnavailable, ValueError) as exc:
                self._fail(RespUnavailable(str(exc)))
                return
            if found is None:
                break
            reply, at = found
            waiter = self.pending.popleft()
            if not waiter.done():
                waiter.set_result(reply)
        del self.buffer[:at]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RespUnavailable(f"connection lost ({exc})" if exc else "connection closed"))

    def _fail(self, error: Exception) -> None:
        self.lost = True
        while self.pending:
            waiter = self.pending.popleft()
            if not waiter.done():
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
        self._shas: dict[str, str] = {}

    @staticmethod
    def supports(url: str) -> bool:
        return urlsplit(url).scheme == "redis"

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
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, self.host, self.port), self.timeout
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

    async def _send(self, protocol: _Protocol, data: bytes) -> Any:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        protocol.pending.append(waiter)
        assert protocol.transport is not None
        protocol.transport.write(data)
        timer = loop.call_later(self.timeout, _time_out, protocol, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def command(self, *command: Any) -> Any:
        """One command's reply; ``RespError`` for an error reply, ``RespUnavailable`` when none came."""
        reply = await self._send(await self._connection(), encode(*command))
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def evalsha(self, sha: str, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` by its digest, loading it once when the server does not have it (NOSCRIPT)."""
        protocol = await self._connection()
        reply = await self._send(protocol, encode("EVALSHA", sha, len(keys), *keys, *args))
        if isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT"):
            reply = await self._send(protocol, encode("EVAL", script, len(keys), *keys, *args))
        if isinstance(reply, RespError):
            raise reply
        return reply


def _time_out(protocol: _Protocol, waiter: asyncio.Future[Any]) -> None:
    # A reply late past the timeout would be taken for the next command's: the connection is dropped.
    if not waiter.done():
        protocol._fail(RespUnavailable(f"no reply within {TIMEOUT_S} s"))
