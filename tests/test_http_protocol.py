"""The web process's HTTP protocol: a response's writes within one turn of the loop leave as one."""

from __future__ import annotations

import asyncio
import socket

from modelforge.http_protocol import CoalescingTransport
from tests.fixtures import run_in_own_loop


def test_head_and_body_written_in_one_turn_reach_the_socket_in_one_send_in_order():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        writes: list[bytes] = []
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        real_write = transport.write
        transport.write = lambda data: (writes.append(bytes(data)), real_write(data))  # type: ignore[method-assign]
        coalescing = CoalescingTransport(transport, loop)  # type: ignore[arg-type]
        coalescing.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        coalescing.write(b"ok")
        assert writes == []  # nothing left yet: the turn is not over
        await asyncio.sleep(0)
        assert writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
        coalescing.write(b"last")
        coalescing.close()  # close flushes first
        await asyncio.sleep(0.05)  # the loop finishes closing
        theirs.settimeout(2)
        received = b""
        while chunk := theirs.recv(1024):
            received += chunk
        assert received == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\noklast"
        theirs.close()

    run_in_own_loop(main)
