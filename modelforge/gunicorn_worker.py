"""The uvicorn worker for gunicorn, without the ASGI lifespan protocol (Django does not speak it)."""

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "lifespan": "off"}
