"""ASGI entry point (gunicorn with uvicorn workers): Django, with the lean endpoints apps mount beside it."""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")

from modelforge import lean, proxies
from modelforge.http_protocol import handler_for
from modelforge.startup import run_entry_checks

# Refuses (exit 3) on bad configuration or an incompatible database, even when gunicorn is started
# without modelforge.gunicorn_conf; with it, the master has already checked and this is a no-op.
run_entry_checks("web")

django_application = get_asgi_application()

# The lean endpoints apps mounted at ready() (modelforge.lean.route: agents' heartbeats, the artifact
# store, the serving gateway), imported now, in the serving process.
EXACT, PREFIXES = lean.routes()
# The proxies whose forwarded headers are believed (MODELFORGE_TRUSTED_PROXIES); None when there are none,
# the usual case: nothing to do per request.
TRUSTED = proxies.trusted() or None


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A path an app mounted a lean endpoint at goes to it (an exact path first, then the longest
    prefix); the rest to Django. (A plain POST to a lean endpoint is dispatched before this, by the web
    worker's protocol: modelforge/http_protocol.py.)"""
    if TRUSTED is not None:
        TRUSTED.resolve(scope)
    if scope["type"] == "http":
        handler = handler_for(scope["path"], EXACT, PREFIXES)
        if handler is not None:
            await handler(scope, receive, send)
            return
    await django_application(scope, receive, send)
