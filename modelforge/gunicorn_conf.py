"""gunicorn configuration: ``gunicorn -c python:modelforge.gunicorn_conf modelforge.asgi:application``.

Start-up validation runs here, in the master, before any worker is forked: a refused start prints the
problems once and exits with status 3 instead of crash-looping workers.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")

from django.conf import settings

from modelforge.signals import web_worker_started
from modelforge.startup import run_entry_checks

run_entry_checks("web")

bind = settings.BIND
workers = settings.WEB_WORKERS
worker_class = "modelforge.gunicorn_worker.Worker"
graceful_timeout = 10
timeout = 60
# uvicorn's worker takes gunicorn's keepalive as its keep-alive timeout; the web protocol applies it to a
# new connection too, and the other client timeouts itself (modelforge/http_protocol.py).
keepalive = settings.HTTP_KEEPALIVE_S
accesslog = None
errorlog = "-"
loglevel = str(settings.LOG_LEVEL).lower()
# gunicorn 27's control socket lives at one path per user; several gunicorns on one machine (make run
# beside make test) would fight over it, and nothing here uses it.
control_socket_disable = True


def post_worker_init(worker: object) -> None:
    """Everything loaded by now lives as long as the worker: moved out of the cyclic collector's sight
    (``gc.freeze``), and the youngest generation collected less often. Each proxied request allocates a few
    hundred short-lived containers, so at the default threshold (700) the collector ran every few
    requests, each time walking objects that are never garbage; the gateway bench measured it at 2-3 % of
    the worker's CPU."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)

    # Each web worker's own threads are the apps' (modelforge.signals): the listening stamps
    # (apps.nodes.listening) and the platform's outage checks (apps.alerts.outages).
    web_worker_started.send(sender=type(worker))
