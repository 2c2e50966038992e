"""ASGI entry point (gunicorn with uvicorn workers): Django, with the node heartbeat endpoint beside it."""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")

from modelforge.startup import run_entry_checks

# Refuses (exit 3) on bad configuration or an incompatible database, even when gunicorn is started
# without modelforge.gunicorn_conf; with it, the master has already checked and this is a no-op.
run_entry_checks("web")

django_application = get_asgi_application()

from apps.artifacts import agent_views as artifact_files  # noqa: E402 -- needs the app registry
from apps.clusters.gateway import PREFIX as GATEWAY_PREFIX  # noqa: E402
from apps.clusters.gateway import gateway  # noqa: E402
from apps.nodes import fastpath  # noqa: E402


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Agents' heartbeats and the serving gateway (/v1/) go to their lean endpoints; the rest to Django."""
    if scope["type"] == "http" and scope["path"] == fastpath.PATH:
        await fastpath.endpoint(scope, receive, send)
        return
    if scope["type"] == "http" and scope["path"].startswith(artifact_files.PREFIX):
        await artifact_files.serve(scope, receive, send)
        return
    if scope["type"] == "http" and scope["path"].startswith(GATEWAY_PREFIX):
        await gateway(scope, receive, send)
        return
    await django_application(scope, receive, send)
