"""The web process's HTTP protocol: a response's writes within one turn of the loop leave as one."""

from __future__ import annotations

import asyncio
import json
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


def serve_with_our_protocol(app, body_check, **options) -> None:  # type: ignore[no-untyped-def]
    """Run ``app`` under uvicorn with the web worker's protocol on a real port; ``body_check(port)`` runs
    in a thread while the server answers."""
    import threading

    import uvicorn

    from modelforge.http_protocol import CoalescingHttpToolsProtocol

    async def main() -> None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            http=CoalescingHttpToolsProtocol,
            lifespan="off",
            log_level="error",
            **options,
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


# --- The lean cycle: a plain POST to a lean endpoint (modelforge.lean) skips uvicorn's own cycle ---------


def serve_lean(monkeypatch, handler, check) -> None:  # type: ignore[no-untyped-def]
    """``handler`` mounted as the only lean endpoint, at ``/lean/``; every other request goes to an app
    that answers 418 (uvicorn's own cycle, as Django's requests do)."""
    from modelforge import http_protocol

    monkeypatch.setattr(http_protocol, "_LEAN", ({}, (("/lean/", handler),), None))

    async def other(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 418, "headers": [(b"content-length", b"3")]})
        await send({"type": "http.response.body", "body": b"tea"})

    serve_with_our_protocol(other, check)


def raw_exchange(port: int, data: bytes, *, until: int = 1, pause_after: int | None = None) -> bytes:
    """Send ``data`` (in two writes, ``pause_after`` bytes then the rest, when given) and read until
    ``until`` responses' ends (``\\r\\n\\r\\n`` of a head followed by its body) or the server closes."""
    import time

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        if pause_after is None:
            sock.sendall(data)
        else:
            sock.sendall(data[:pause_after])
            time.sleep(0.2)
            sock.sendall(data[pause_after:])
        received = b""
        while received.count(b"HTTP/1.1 ") < until or not _ended(received, until):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def _ended(received: bytes, count: int) -> bool:
    import re

    heads = [m.start() for m in re.finditer(rb"HTTP/1\.1 \d{3}", received)]
    if len(heads) < count:
        return False
    last = received[heads[count - 1] :]
    head, _, body = last.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        return body.endswith(b"0\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head.lower())
    return length is not None and len(body) >= int(length.group(1))


async def echo(scope, receive, send):  # type: ignore[no-untyped-def]
    """Reads the whole body, answers it with its length, and what the scope said."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = json.dumps({"path": scope["path"], "method": scope["method"], "body": body.decode()}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))],
        }
    )
    await send({"type": "http.response.body", "body": answer})


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n%s" % (
        path.encode(),
        len(body),
        extra,
        body,
    )


def test_a_lean_post_is_answered_with_the_date_and_the_connection_kept_for_the_next(monkeypatch):
    def check(port: int) -> None:
        answer = raw_exchange(
            port, post("/lean/a", b"one") + post("/lean/b", b"") + post("/other", b"x"), until=3
        )
        first, second, third = answer.split(b"HTTP/1.1 ")[1:]
        assert first.startswith(b"200 OK") and b"\r\ndate: " in first
        assert json.loads(first.partition(b"\r\n\r\n")[2]) == {
            "path": "/lean/a",
            "method": "POST",
            "body": "one",
        }
        # An empty body is a body: the first receive gives it, not a wait for the client to go.
        assert json.loads(second.partition(b"\r\n\r\n")[2])["body"] == ""
        assert third.startswith(b"418") and third.endswith(b"tea")  # not lean: uvicorn's cycle, in order
        assert b"connection: close" not in answer

    serve_lean(monkeypatch, echo, check)


def test_a_lean_body_that_arrives_in_pieces_is_received_whole(monkeypatch):
    def check(port: int) -> None:
        body = b"x" * 200_000  # beyond uvicorn's high-water mark: reading pauses and resumes
        answer = raw_exchange(port, post("/lean/slow", body), pause_after=100)
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["body"] == body.decode()

    serve_lean(monkeypatch, echo, check)


def test_lean_requests_that_are_not_plain_posts_take_uvicorns_cycle(monkeypatch):
    seen: list[str] = []

    async def handler(scope, receive, send):  # type: ignore[no-untyped-def]
        seen.append(scope["method"])
        await echo(scope, receive, send)

    def check(port: int) -> None:
        for request in (
            post("/lean/q?x=1", b"a"),  # a query string
            post("/lean/%41", b"a"),  # percent-encoded
            post("/lean/e", b"a", b"expect: 100-continue\r\n"),
            b"GET /lean/g HTTP/1.1\r\nhost: x\r\n\r\n",
        ):
            assert raw_exchange(port, request).startswith(b"HTTP/1.1 418")

    serve_lean(monkeypatch, handler, check)
    assert seen == []


def test_a_lean_endpoint_that_fails_before_answering_gets_a_500_and_a_closed_connection(monkeypatch):
    async def broken(scope, receive, send):  # type: ignore[no-untyped-def]
        raise ValueError("boom")

    def check(port: int) -> None:
        answer = raw_exchange(port, post("/lean/x", b"a") + post("/lean/y", b"b"), until=2)
        assert answer.startswith(b"HTTP/1.1 500") and b"connection: close" in answer.lower()
        assert answer.count(b"HTTP/1.1 ") == 1  # closed: the pipelined request after it is not served

    serve_lean(monkeypatch, broken, check)


def test_a_lean_endpoint_asking_to_close_closes_and_a_stream_is_chunked(monkeypatch):
    async def streaming(scope, receive, send):  # type: ignore[no-untyped-def]
        await receive()
        headers = [(b"content-type", b"text/event-stream"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def check(port: int) -> None:
        answer = raw_exchange(port, post("/lean/s", b"{}") + post("/lean/t", b"{}"), until=2)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head and head.count(b"connection: close") == 1
        assert body == b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"  # and then closed

    serve_lean(monkeypatch, streaming, check)


def test_a_lean_endpoint_hears_the_client_go_away_while_it_waits(monkeypatch):
    heard: list[str] = []

    async def waiting(scope, receive, send):  # type: ignore[no-untyped-def]
        await receive()  # the body
        heard.append((await receive())["type"])  # then: nothing until the client goes

    def check(port: int) -> None:
        import time

        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(post("/lean/w", b"{}"))
            time.sleep(0.2)
        for _ in range(100):
            if heard:
                break
            time.sleep(0.02)

    serve_lean(monkeypatch, waiting, check)
    assert heard == ["http.disconnect"]


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout_and_a_busy_one_is_not():
    import time

    async def slow(scope, receive, send):  # type: ignore[no-untyped-def]
        await asyncio.sleep(float(scope["query_string"] or 0))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    def ask(sock: socket.socket, wait: float) -> bytes:
        sock.sendall(b"GET /?%.2f HTTP/1.1\r\nhost: x\r\n\r\n" % wait)
        answer = b""
        while not answer.endswith(b"ok"):
            chunk = sock.recv(1024)
            if not chunk:
                return answer
            answer += chunk
        return answer

    def check(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            # Requests closer together than the timeout, and one that takes longer than it to answer:
            # the connection is never idle for 0.4 s, so it stays.
            for wait in (0.0, 0.6, 0.0):
                assert ask(sock, wait).startswith(b"HTTP/1.1 200")
                time.sleep(0.25)
            assert ask(sock, 0.0).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            assert sock.recv(1024) == b""  # idle: closed by the server
            assert 0.3 < time.monotonic() - started < 1.5

    serve_with_our_protocol(slow, check, timeout_keep_alive=0.4)
