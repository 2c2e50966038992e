"""Slow and idle clients (issue 47, item 4): the web protocol closes a connection a client holds without
using it (no request, headers or a body a byte at a time, an answer it does not read) within the
documented times, while a long stream and a slow-but-steady client are served to the end.

The timeouts are set short through the settings the protocol reads, so each test runs for seconds; the
socket timeouts are the bound: a connection the server never closes fails the test, it does not hang it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest

from tests.fixtures import start_web
from tests.test_http_protocol import serve_lean, serve_with_our_protocol

KEEPALIVE = 0.5
SHORT = {"HTTP_HEADER_TIMEOUT_S": 0.5, "HTTP_BODY_TIMEOUT_S": 1.0, "HTTP_SEND_TIMEOUT_S": 1.0}
BOUND_S = 8.0  # far past every timeout above: the server must have acted by then


@pytest.fixture
def short_timeouts(settings, monkeypatch):  # type: ignore[no-untyped-def]
    from modelforge import http_protocol

    for name, value in SHORT.items():
        setattr(settings, name, value)
    # No lean endpoints but those a test mounts (``serve_lean``): a POST finds none without importing the
    # entry point, which checks the database.
    monkeypatch.setattr(http_protocol, "_LEAN", ({}, ()))
    return settings


async def echo_body(scope, receive, send):  # type: ignore[no-untyped-def]
    """Reads the whole body, then answers its length."""
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


def read_until_closed(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)


def trickle(sock: socket.socket, pieces: list[bytes], every: float) -> bytes:
    """Sends ``pieces`` one every ``every`` seconds, stopping when the server answers or closes; returns
    the answer (what it sent before closing). Fails if the server has done neither within ``BOUND_S``."""
    sock.settimeout(every)
    started = time.monotonic()
    for piece in pieces:
        try:
            sock.sendall(piece)
            first = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return b""
        sock.settimeout(BOUND_S)
        return first + read_until_closed(sock)
    pytest.fail(f"the server still held the connection after {time.monotonic() - started:.1f} s")


def assert_408(answer: bytes) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    envelope = json.loads(body)
    assert set(envelope) == {"code", "message", "correlation_id"}
    assert envelope["code"] == "REQUEST_TIMEOUT"
    return envelope


def test_a_connection_that_never_sends_a_request_is_closed_after_the_keep_alive_timeout(short_timeouts):
    # Regression: a new connection had no timer at all (uvicorn arms its one after a first response).
    def check(port: int) -> None:
        with connect(port) as sock:
            assert sock.recv(1024) == b""  # closed by the server; a socket timeout fails the test

    serve_with_our_protocol(echo_body, check, timeout_keep_alive=KEEPALIVE)


def test_a_slowloris_client_is_answered_408_and_closed_within_the_header_timeout(short_timeouts):
    # Regression: 200 connections sending partial headers were all still open after 40 s.
    def check(port: int) -> None:
        with connect(port) as sock:
            pieces = [b"GET / HTTP/1.1\r\nHost: x\r\n"] + [b"X-Slow: %d\r\n" % n for n in range(100)]
            envelope = assert_408(trickle(sock, pieces, 0.1))
            assert "MODELFORGE_HTTP_HEADER_TIMEOUT_S" in envelope["message"]

    serve_with_our_protocol(echo_body, check, timeout_keep_alive=60)


@pytest.mark.parametrize("path", ["/django-like", "/lean/x"], ids=["uvicorn-cycle", "lean-cycle"])
def test_a_body_at_a_byte_at_a_time_is_answered_408_within_the_body_timeout(
    short_timeouts, monkeypatch, path
):
    # Regression: bodies sent at 1 byte/s stayed open for 150 s.
    def check(port: int) -> None:
        with connect(port) as sock:
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n".encode()
            envelope = assert_408(trickle(sock, [head] + [b"x"] * 200, 0.1))
            assert "MODELFORGE_HTTP_BODY_TIMEOUT_S" in envelope["message"]

    if path.startswith("/lean/"):
        serve_lean(monkeypatch, echo_body, check)
    else:
        serve_with_our_protocol(echo_body, check, timeout_keep_alive=60)


def test_a_client_that_reads_nothing_of_a_large_answer_is_cut_off(short_timeouts):
    ended: list[str] = []

    async def large(scope, receive, send):  # type: ignore[no-untyped-def]
        await receive()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % (256 << 20))],
            }
        )
        block = b"x" * (1 << 20)
        for _ in range(256):  # without yielding to the loop, as an answer from memory does
            await send({"type": "http.response.body", "body": block, "more_body": True})
        ended.append((await receive())["type"])  # at once once cut off; until then, nothing

    def check(port: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        with sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            deadline = time.monotonic() + BOUND_S
            while not ended and time.monotonic() < deadline:  # read nothing; wait for the server to give up
                time.sleep(0.05)
            cut_off = bool(ended)  # judged before this side closes (which would end the answer too)
        assert cut_off, "the server was still writing to a client that read nothing"

    serve_with_our_protocol(large, check, timeout_keep_alive=60)
    # The application's sends returned (uvicorn drops what is sent to a closed connection), and it heard
    # the client gone: its task ended rather than waiting on the client for ever.
    assert ended == ["http.disconnect"]


def test_a_long_stream_and_slow_but_steady_clients_are_served_to_the_end(short_timeouts):
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["method"] == "POST":
            await echo_body(scope, receive, send)
            return
        await receive()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        if scope["path"] == "/stream":  # a generation: a token every 0.25 s, 3 s in all
            for n in range(12):
                await send({"type": "http.response.body", "body": b"token%d\n" % n, "more_body": True})
                await asyncio.sleep(0.25)
        else:  # 16 MiB, for a reader that takes it slowly
            for _ in range(16):
                await send({"type": "http.response.body", "body": b"y" * (1 << 20), "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    def check(port: int) -> None:
        import httpx

        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=BOUND_S) as client:
            stream = client.get("/stream")
            assert stream.status_code == 200
            assert stream.text == "".join(f"token{n}\n" for n in range(12))

            with client.stream("GET", "/large") as large:  # 256 KiB every 0.05 s: steady, slower than sent
                got = 0
                for chunk in large.iter_bytes(256 << 10):
                    got += len(chunk)
                    time.sleep(0.05)
            assert got == 16 << 20

            def steady() -> Any:  # a body a few bytes at a time, all within the body timeout
                for _ in range(10):
                    yield b"0123456789"
                    time.sleep(0.03)

            posted = client.post("/upload", content=steady())
            assert (posted.status_code, posted.text) == (200, "100")

    serve_with_our_protocol(app, check, timeout_keep_alive=KEEPALIVE)


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_the_web_process_applies_the_timeouts_from_its_settings(tmp_path):
    web = start_web(
        tmp_path / "web.log", MODELFORGE_HTTP_KEEPALIVE_S="1", MODELFORGE_HTTP_HEADER_TIMEOUT_S="1"
    )
    try:
        port = int(web.url.rsplit(":", 1)[1])
        with connect(port) as idle:
            assert idle.recv(1024) == b""
        with connect(port) as slow:
            pieces = [b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"] + [b"X-Slow: 1\r\n"] * 100
            assert_408(trickle(slow, pieces, 0.1))
        with connect(port) as prompt:
            prompt.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert read_until_closed(prompt).startswith(b"HTTP/1.1 200")
    finally:
        web.process.stop()


def test_headers_past_64_kib_are_answered_431_and_closed_and_headers_within_are_served(short_timeouts):
    # Regression: httptools has no bound on headers; a 64 MiB header was read (and copied) as it grew.
    from modelforge.http_protocol import MAX_HEADER_BYTES

    def check(port: int) -> None:
        with connect(port) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: %s\r\n" % (b"a" * 4000) * 15 + b"\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "headers within the bound are served"
        with connect(port) as sock:
            # Just past the bound, all of it read before the answer (a close with bytes unread is a reset).
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEADER_BYTES)
            head, _, body = read_until_closed(sock).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431"), head
        assert json.loads(body)["code"] == "HEADERS_TOO_LARGE"

    serve_with_our_protocol(echo_body, check, timeout_keep_alive=60)
