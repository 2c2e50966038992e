"""gunicorn configuration: ``gunicorn -c python:modelforge.gunicorn_conf modelforge.asgi:application``.

Start-up validation runs here, in the master, before any worker is forked: a refused start prints the
problems once and exits with status 3 instead of crash-looping workers.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")

from django.conf import settings

from modelforge.startup import run_entry_checks

run_entry_checks("web")

bind = settings.BIND
workers = settings.WEB_WORKERS
worker_class = "modelforge.gunicorn_worker.Worker"
graceful_timeout = 10
timeout = 60
keepalive = 5
accesslog = None
errorlog = "-"
loglevel = str(settings.LOG_LEVEL).lower()
# gunicorn 27's control socket lives at one path per user; several gunicorns on one machine (make run
# beside make test) would fight over it, and nothing here uses it.
control_socket_disable = True
