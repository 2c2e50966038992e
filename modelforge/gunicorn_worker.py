"""The uvicorn worker for gunicorn, without the ASGI lifespan protocol (Django does not speak it), and
with uvicorn's housekeeping tick once a second instead of ten times."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from types import FrameType

from gunicorn.arbiter import Arbiter
from uvicorn import Server as UvicornServer
from uvicorn_worker import UvicornWorker

# uvicorn's server wakes every 0.1 s to see whether it should exit, and does its real housekeeping (the
# Date header, gunicorn's liveness notice, max-requests) every tenth time. Each wake resumes four
# coroutines: about 1 ms of CPU a second of an idle worker's 7 (bench/gateway/idle.py, 2026-12-04), a
# share an engine on the same core waits behind. Here it wakes once a second, and at once on a signal.
TICK_S = 1.0


class Server(UvicornServer):
    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # every tick is a tenth: the housekeeping runs at each
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # A signal's Python handler runs on the loop's thread between callbacks; threadsafe all the same.
        loop, wake = getattr(self, "_loop", None), getattr(self, "_wake", None)
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)


class Worker(UvicornWorker):
    CONFIG_KWARGS = {
        **UvicornWorker.CONFIG_KWARGS,
        "lifespan": "off",
        # httptools, with a response's head and body written in one system call (modelforge/http_protocol.py).
        "http": "modelforge.http_protocol:CoalescingHttpToolsProtocol",
        # No "server: uvicorn" on every response: it tells a client nothing it needs, and each header
        # is checked against two expressions per response.
        "server_header": False,
        # X-Forwarded-For and -Proto are read by modelforge.proxies, from MODELFORGE_TRUSTED_PROXIES only:
        # uvicorn's own reading believed them from 127.0.0.1 (gunicorn's forwarded_allow_ips default).
        "proxy_headers": False,
    }

    async def _serve(self) -> None:
        # UvicornWorker._serve (uvicorn-worker 0.4), with the server above.
        self.config.app = self.wsgi
        server = Server(config=self.config)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
