"""Moments in a process's life that apps act on. The kernel's entry points send them and name no app;
each app connects its own receivers at ``AppConfig.ready()``."""

from __future__ import annotations

from django.dispatch import Signal

# A gunicorn web worker is initialised and about to serve (``modelforge.gunicorn_conf.post_worker_init``):
# the place for the worker's own background threads (listening stamps, outage checks).
web_worker_started = Signal()

# Beat's scheduler ticked (``modelforge.beat.Scheduler.tick``), with ``hostname``; a receiver keeps its own
# pace and never lets a failure reach beat.
beat_ticked = Signal()
