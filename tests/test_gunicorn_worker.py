"""The web worker's uvicorn server: housekeeping once a second, and a signal to exit acted on at once."""

from __future__ import annotations

import asyncio
import signal
import time
from email.utils import parsedate_to_datetime

import httpx
import pytest
import uvicorn

from modelforge import gunicorn_worker
from tests.fixtures import run_in_own_loop


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_signal_ends_the_tick_at_once_and_the_date_header_keeps_being_set(monkeypatch):
    # A tick far longer than the test: only the wake-up can end the server's loop in time.
    monkeypatch.setattr(gunicorn_worker, "TICK_S", 60.0)

    async def main() -> tuple[float, str]:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="error")
        server = gunicorn_worker.Server(config)
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient() as client:
            date = (await client.get(f"http://127.0.0.1:{port}/")).headers["date"]
        started = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)
        await asyncio.wait_for(serving, 10)
        return time.monotonic() - started, date

    took, date = run_in_own_loop(main)
    assert took < 5  # not the 60 s tick
    assert abs(parsedate_to_datetime(date).timestamp() - time.time()) < 30


def test_the_housekeeping_runs_at_every_tick(monkeypatch):
    """Each once-a-second tick is uvicorn's tenth (its Date header and gunicorn's notice run at the tenth)."""
    monkeypatch.setattr(gunicorn_worker, "TICK_S", 0.01)
    ticks: list[int] = []

    async def main() -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="error")
        server = gunicorn_worker.Server(config)

        async def on_tick(counter: int) -> bool:
            ticks.append(counter)
            return len(ticks) >= 4

        server.on_tick = on_tick  # type: ignore[method-assign]
        await asyncio.wait_for(server.main_loop(), 5)

    run_in_own_loop(main)
    assert ticks == [0, 10, 20, 30]
    assert all(counter % 10 == 0 for counter in ticks)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_handle_exit_before_the_loop_started_is_harmless(sig):
    server = gunicorn_worker.Server(uvicorn.Config(app, lifespan="off"))
    server.handle_exit(sig, None)
    assert server.should_exit
