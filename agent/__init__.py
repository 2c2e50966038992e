"""The ModelForge node agent: a stand-alone package that imports nothing from ``apps/`` or ``modelforge/``.

Enrollment, heartbeats and GPU telemetry arrive with the nodes issue; for now it only says so.
"""

__version__ = "0.1.0"
