"""The gateway's configuration rule, as a system check (``modelforge.checks``): the sin-bin's cap is at
least its base time. Registered when ``GatewayConfig.ready()`` imports this module."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from modelforge.checks import CONFIGURATION, configuration_message
from modelforge.config import INVALID_SETTING


@checks.register(CONFIGURATION)
def bench_times(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """gateway.E001: ``MODELFORGE_LB_MAX_BENCH_S`` is at least ``MODELFORGE_LB_BASE_BENCH_S``."""
    base, cap = settings.LB_BASE_BENCH_S, settings.LB_MAX_BENCH_S
    if cap >= base:
        return []
    return [
        configuration_message(
            "gateway.E001",
            INVALID_SETTING,
            "MODELFORGE_LB_MAX_BENCH_S",
            f"{cap} s is shorter than MODELFORGE_LB_BASE_BENCH_S ({base} s); "
            "the cap must be at least the base bench time",
        )
    ]
