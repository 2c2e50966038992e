"""The gateway's upstream client against real sockets on 127.0.0.1: keep-alive reuse, a stale pooled
connection retried once, refused connections, timeouts, streaming chunk by chunk, broken answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from apps.gateway import upstream as upstream_module
from apps.gateway.upstream import ConnectFailed, Upstream, UpstreamBroken, UpstreamTimeout
from tests.fixtures import run_in_own_loop

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


def serve(handler: Handler, test: Callable[[str, dict[str, int]], Awaitable[None]]) -> dict[str, int]:
    """Run ``handler`` as a real TCP server and ``test(url, stats)`` against it; returns the stats."""
    stats = {"connections": 0}

    async def main() -> None:
        async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            stats["connections"] += 1
            try:
                await handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(counted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            await test(f"http://127.0.0.1:{port}", stats)

    run_in_own_loop(main)
    return stats


async def answer_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await read_request(reader)
        body = b'{"echo": %d}' % len(request)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        writer.write(body)
        await writer.drain()


def test_one_kept_alive_connection_serves_request_after_request():
    async def test(url: str, stats: dict[str, int]) -> None:
        upstream = Upstream()
        for _ in range(20):
            response = await upstream.post(
                url, "/v1/embeddings", b"{}", [("Content-Type", "application/json")]
            )
            assert response.status == 200 and response.content_type() == b"application/json"
            assert (await response.read()).startswith(b'{"echo"')
            response.release()
        upstream.close()

    assert serve(answer_forever, test)["connections"] == 1


def test_a_pooled_connection_the_backend_closed_is_replaced_once():
    async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # closes without saying Connection: close, like an idle timeout on the backend

    async def test(url: str, stats: dict[str, int]) -> None:
        upstream = Upstream()
        for _ in range(3):
            response = await upstream.post(url, "/v1/chat/completions", b"{}", [])
            assert await response.read() == b"ok"
            response.release()
            await asyncio.sleep(0.05)  # the backend's close arrives while the connection is idle

    assert serve(one_answer_then_close, test)["connections"] == 3


def test_a_refused_connection_is_connect_failed_and_nothing_was_sent():
    async def test() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectFailed):
            await Upstream().post(f"http://127.0.0.1:{port}", "/v1/embeddings", b"{}", [])

    run_in_own_loop(test)


def test_a_silent_backend_times_out():
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async def test(url: str, stats: dict[str, int]) -> None:
        with pytest.raises(UpstreamTimeout):
            await Upstream(read_timeout=0.2).post(url, "/v1/embeddings", b"{}", [])

    serve(silent, test)


def test_the_watchdog_rests_while_nothing_waits_and_a_wait_after_its_rest_still_times_out(monkeypatch):
    """An idle gateway's loop has no timer of the pool's to wake for; the first wait after the rest starts
    the watchdog again, so a silent backend still times out."""
    monkeypatch.setattr(upstream_module, "WATCH_REST_AFTER", 2)
    calls = {"n": 0}

    async def first_quick_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            calls["n"] += 1
            if calls["n"] > 1:
                await asyncio.sleep(5)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    async def test(url: str, stats: dict[str, int]) -> None:
        pool = Upstream(read_timeout=0.2)
        answer = await pool.post(url, "/v1/embeddings", b"{}", [])
        await answer.read()
        assert pool._watchdog is not None  # started by the first wait
        await asyncio.sleep(0.05 * 2 + 0.2)  # two checks (every read_timeout / 4) with nothing waiting
        assert pool._watchdog is None
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout):
            await pool.post(url, "/v1/embeddings", b"{}", [])
        assert time.monotonic() - started < 2  # timed out by the watchdog, not the backend's 5 s

    serve(first_quick_then_silent, test)


def event_stream(*bursts: tuple[int, ...]) -> Handler:
    """A backend answering with a chunked event stream: its head, then each burst's events (``data: <n>``,
    an HTTP chunk each) in one write, 0.1 s after the last."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for burst in bursts:
            await writer.drain()
            await asyncio.sleep(0.1)
            for index in burst:
                data = b"data: %d\n\n" % index
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return handler


def test_a_stream_arrives_chunk_by_chunk_not_buffered():
    async def test(url: str, stats: dict[str, int]) -> None:
        loop = asyncio.get_running_loop()
        response = await Upstream().post(url, "/v1/chat/completions", b"{}", [])
        assert not response.complete
        arrivals = []
        async for chunk in response.chunks():
            arrivals.append((loop.time(), chunk))
        assert [chunk for _, chunk in arrivals] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
        assert arrivals[-1][0] - arrivals[0][0] >= 0.15  # handed on as they came, not at the end
        response.release()

    serve(event_stream((0,), (1,), (2,)), test)


def test_pieces_that_arrived_together_are_handed_on_together():
    """Events the backend sent in one go are one piece (one send to the client, one pass of the model
    renamer): a stream's cost per read, not per event. What comes later is still a piece of its own."""

    async def test(url: str, stats: dict[str, int]) -> None:
        response = await Upstream().post(url, "/v1/chat/completions", b"{}", [])
        pieces = [piece async for piece in response.chunks()]
        assert pieces == [b"data: 0\n\ndata: 1\n\ndata: 2\n\n", b"data: 3\n\ndata: 4\n\n"]
        response.release()

    serve(event_stream((0, 1, 2), (3, 4)), test)  # several HTTP chunks in one write


def test_an_answer_cut_short_is_broken():
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async def test(url: str, stats: dict[str, int]) -> None:
        response = await Upstream().post(url, "/v1/embeddings", b"{}", [])
        with pytest.raises(UpstreamBroken):
            await response.read()
        response.release()

    serve(cut, test)


def test_an_answer_that_is_not_http_is_broken():
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def test(url: str, stats: dict[str, int]) -> None:
        with pytest.raises(UpstreamBroken):
            await Upstream().post(url, "/v1/embeddings", b"{}", [])

    serve(garbage, test)


def test_connections_to_one_backend_are_capped_and_requests_wait_for_one(monkeypatch):
    monkeypatch.setattr(upstream_module, "MAX_CONNECTIONS_PER_BACKEND", 2)

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def test(url: str, stats: dict[str, int]) -> None:
        upstream = Upstream()

        async def one() -> bytes:
            response = await upstream.post(url, "/v1/embeddings", b"{}", [])
            try:
                return await response.read()
            finally:
                response.release()

        assert await asyncio.gather(*(one() for _ in range(6))) == [b"ok"] * 6

    assert serve(slow, test)["connections"] == 2


def test_a_connection_idle_past_the_timeout_is_closed(monkeypatch):
    async def test(url: str, stats: dict[str, int]) -> None:
        upstream = Upstream()
        response = await upstream.post(url, "/v1/embeddings", b"{}", [])
        await response.read()
        response.release()
        clock = time.monotonic() + upstream_module.IDLE_TIMEOUT_S + 1
        monkeypatch.setattr(upstream_module.time, "monotonic", lambda: clock)
        response = await upstream.post(url, "/v1/embeddings", b"{}", [])
        await response.read()
        response.release()

    assert serve(answer_forever, test)["connections"] == 2
