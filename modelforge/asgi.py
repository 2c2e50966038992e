"""ASGI entry point (gunicorn with uvicorn workers)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")

from modelforge.startup import run_entry_checks

# Refuses (exit 3) on bad configuration or an incompatible database, even when gunicorn is started
# without modelforge.gunicorn_conf; with it, the master has already checked and this is a no-op.
run_entry_checks("web")

application = get_asgi_application()
