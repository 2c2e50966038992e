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


def serve_with_our_protocol(app, body_check) -> None:  # type: ignore[no-untyped-def]
    """Run ``app`` under uvicorn with the web worker's protocol on a real port; ``body_check(port)`` runs
    in a thread while the server answers."""
    import threading

    import uvicorn

    from modelforge.http_protocol import CoalescingHttpToolsProtocol

    async def main() -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, http=CoalescingHttpToolsProtocol, lifespan="off", log_level="error"
        )
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        failures: list[BaseException] = []

        def check() -> None:
            try:
                body_check(port)
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=check)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        server.should_exit = True
        await serving
        if failures:
            raise failures[0]

    run_in_own_loop(main)


def test_zero_copy_send_hands_a_file_range_to_the_socket_and_keeps_the_connection(tmp_path):
    import http.client

    from modelforge.http_protocol import ZERO_COPY

    data = bytes(range(256)) * 40_000  # 10 MB, more than a socket buffer holds
    path = tmp_path / "blob"
    path.write_bytes(data)
    seen_extensions: list[bool] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        offset = int(scope["query_string"] or 0)
        seen_extensions.append(ZERO_COPY in scope.get("extensions", {}))
        headers = [(b"content-length", str(len(data) - offset).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        with path.open("rb") as reader:
            await send({"type": ZERO_COPY, "file": reader, "offset": offset, "count": len(data) - offset})

    def fetch(port: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for offset in (0, 1234567):  # two requests on one kept-alive connection
            connection.request("GET", f"/?{offset}")
            response = connection.getresponse()
            assert response.status == 200
            assert response.read() == data[offset:]
        connection.close()

    serve_with_our_protocol(app, fetch)
    assert seen_extensions == [True, True]


def test_zero_copy_send_to_a_client_that_went_away_ends_quietly(tmp_path):
    import socket as sockets

    from modelforge.http_protocol import ZERO_COPY

    path = tmp_path / "blob"
    path.write_bytes(b"x" * (32 << 20))
    outcomes: list[str] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        headers = [(b"content-length", b"33554432")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        with path.open("rb") as reader:
            try:
                await send({"type": ZERO_COPY, "file": reader, "offset": 0, "count": 32 << 20})
                outcomes.append("returned")
            except BaseException as exc:
                outcomes.append(f"raised {exc!r}")

    def hang_up(port: int) -> None:
        client = sockets.create_connection(("127.0.0.1", port), timeout=10)
        client.setsockopt(sockets.SOL_SOCKET, sockets.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
        client.close()  # a reset, with most of the file unsent
        import time

        deadline = time.monotonic() + 10
        while not outcomes and time.monotonic() < deadline:
            time.sleep(0.02)

    serve_with_our_protocol(app, hang_up)
    assert outcomes == ["returned"]


def test_a_client_that_stops_reading_a_file_does_not_hold_up_other_requests(tmp_path):
    import socket as sockets
    import time

    from modelforge.http_protocol import ZERO_COPY

    path = tmp_path / "blob"
    path.write_bytes(b"x" * (64 << 20))  # far more than the socket buffers hold

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["path"] == "/ping":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
            await send({"type": "http.response.body", "body": b"pong"})
            return
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"67108864")]}
        )
        with path.open("rb") as reader:
            await send({"type": ZERO_COPY, "file": reader, "offset": 0, "count": 64 << 20})

    def stall_then_ping(port: int) -> None:
        staller = sockets.create_connection(("127.0.0.1", port), timeout=10)
        staller.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVBUF, 65536)
        staller.sendall(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
        assert staller.recv(1024).startswith(b"HTTP/1.1 200")  # then reads nothing more
        time.sleep(0.3)  # the transfer is now blocked on the full socket
        started = time.monotonic()
        other = sockets.create_connection(("127.0.0.1", port), timeout=5)
        other.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = other.recv(1024)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"pong")
        assert time.monotonic() - started < 2
        other.close()
        staller.close()

    serve_with_our_protocol(app, stall_then_ping)
