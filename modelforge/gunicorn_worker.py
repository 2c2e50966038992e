"""The uvicorn worker for gunicorn, without the ASGI lifespan protocol (Django does not speak it)."""

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):
    CONFIG_KWARGS = {
        **UvicornWorker.CONFIG_KWARGS,
        "lifespan": "off",
        # httptools, with a response's head and body written in one system call (modelforge/http_protocol.py).
        "http": "modelforge.http_protocol:CoalescingHttpToolsProtocol",
        # No "server: uvicorn" on every response: it tells a client nothing it needs, and each header
        # is checked against two expressions per response.
        "server_header": False,
    }
