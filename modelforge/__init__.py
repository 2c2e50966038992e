"""ModelForge control plane.

Next to nothing is imported here: ``make run`` (``python -m modelforge.devstack``) imports this package
first, and must be able to take Ctrl-C from its first moment. The Celery application is loaded by Django at
start-up (``apps.core``'s ``ready``), and found by ``celery -A modelforge`` as ``modelforge.celery``.

What is here: the finder that imports the request path's modules compiled, where ``make`` built them
(modelforge/compiled.py). Every process imports this package before any of those modules.
"""

from modelforge import compiled

compiled.install()
