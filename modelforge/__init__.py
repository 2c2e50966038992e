"""ModelForge control plane.

Nothing is imported here: ``make run`` (``python -m modelforge.devstack``) imports this package first, and
must be able to take Ctrl-C from its first moment. The Celery application is loaded by Django at start-up
(``apps.core``'s ``ready``), and found by ``celery -A modelforge`` as ``modelforge.celery``.
"""
