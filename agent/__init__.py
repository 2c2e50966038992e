"""The ModelForge node agent: a stand-alone package that imports nothing from ``apps/`` or ``modelforge/``.

It talks to the control plane over HTTP only: it enrolls once, then publishes heartbeats carrying
inventory and GPU telemetry (NVML via nvidia-ml-py), and answers signed calls on its own port.
See ``agent/README.md``.
"""

__version__ = "0.1.0"
