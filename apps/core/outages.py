"""The platform's recent outages, as the dashboard's home page lists them.

The outage checks themselves raise alerts, so they live with the alerts (``apps.alerts.outages``), above
this app; they provide the list here at ``AlertsConfig.ready()`` (``provide``). Without a provider the
list is empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

_provider: Callable[[], Sequence[Any]] | None = None


def provide(provider: Callable[[], Sequence[Any]]) -> None:
    """Name the function that lists the recent outages (open ones and those of the last day)."""
    global _provider
    _provider = provider


def recent_outages() -> Sequence[Any]:
    return _provider() if _provider is not None else []
