"""Configuration problems as Django system checks, so ``manage.py check`` reports what start-up reports.

Each problem collected while settings loaded (``MODELFORGE_CONFIG_PROBLEMS``) becomes one check message
with the id ``modelforge.<CODE>``: an error in production (where every entry point refuses it with exit 3),
a warning in development (where the process starts anyway).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from modelforge.config import Problem


@checks.register("modelforge")
def configuration_problems(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    problems: list[Problem] = getattr(settings, "MODELFORGE_CONFIG_PROBLEMS", [])
    level = checks.Error if settings.PRODUCTION else checks.Warning
    return [
        level(
            problem.message,
            hint="docs/CONFIGURATION.md and docs/TROUBLESHOOTING.md explain each code",
            obj=problem.setting,
            id=f"modelforge.{problem.code}",
        )
        for problem in problems
    ]
