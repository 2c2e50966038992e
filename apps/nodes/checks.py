"""The nodes' configuration rules, as system checks (``modelforge.checks``): the liveness thresholds must
leave room for late heartbeats, and the control plane must be able to tell its own absence from its
nodes'. Registered when ``NodesConfig.ready()`` imports this module."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from modelforge.checks import CONFIGURATION, configuration_message
from modelforge.config import INVALID_SETTING


@checks.register(CONFIGURATION)
def liveness_thresholds(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """nodes.E001: stale only after three heartbeat intervals; nodes.E002: offline only after stale."""
    interval, stale_after = settings.HEARTBEAT_INTERVAL, settings.NODE_STALE_AFTER
    offline_after = settings.NODE_OFFLINE_AFTER
    found = []
    if stale_after < 3 * interval:
        found.append(
            configuration_message(
                "nodes.E001",
                INVALID_SETTING,
                "MODELFORGE_NODE_STALE_AFTER",
                f"{stale_after} s is less than three heartbeat intervals ({3 * interval} s); a late "
                "heartbeat would flap nodes to stale. Raise it or lower MODELFORGE_HEARTBEAT_INTERVAL",
            )
        )
    if offline_after <= stale_after:
        found.append(
            configuration_message(
                "nodes.E002",
                INVALID_SETTING,
                "MODELFORGE_NODE_OFFLINE_AFTER",
                f"{offline_after} s must be greater than MODELFORGE_NODE_STALE_AFTER ({stale_after} s)",
            )
        )
    return found


@checks.register(CONFIGURATION)
def listening(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """nodes.E003: the listening stamps stay on in production; nodes.E004: a listening gap longer than two
    sweeps (otherwise every sweep looks like the end of a gap and restarts every grace period)."""
    found = []
    if settings.PRODUCTION and not settings.LISTENING_STAMPS:
        found.append(
            configuration_message(
                "nodes.E003",
                INVALID_SETTING,
                "MODELFORGE_LISTENING_STAMPS",
                "must stay true in production: without the web processes' stamps an outage of the control "
                "plane would be taken for an outage of the fleet",
            )
        )
    gap, sweep = settings.LISTENING_GAP, settings.LIVENESS_SWEEP_INTERVAL
    if gap <= 2 * sweep:
        found.append(
            configuration_message(
                "nodes.E004",
                INVALID_SETTING,
                "MODELFORGE_LISTENING_GAP",
                f"{gap} s must be more than twice MODELFORGE_LIVENESS_SWEEP_INTERVAL ({sweep} s), or every "
                "sweep restarts the nodes' grace period",
            )
        )
    return found
