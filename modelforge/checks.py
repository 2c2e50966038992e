"""Configuration problems as Django system checks, so ``manage.py check`` reports what start-up reports.

Two sources, one shape. Each problem collected while settings loaded (``MODELFORGE_CONFIG_PROBLEMS``)
becomes one check message with the id ``modelforge.<CODE>``; the rules spanning several settings that
belong to an app (node liveness thresholds, the gateway's bench times, artifact roots) are that app's own
checks, registered under the ``CONFIGURATION`` tag with ids such as ``nodes.E001`` and built with
``configuration_message``. Either is an error in production (where every entry point refuses it with exit
3: ``modelforge.startup.enforce`` runs these checks) and a warning in development (where the process
starts anyway).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from modelforge.config import Problem

# The tag of every configuration check: what ``enforce`` runs at each entry point.
CONFIGURATION = "modelforge"
HINT = "docs/CONFIGURATION.md and docs/TROUBLESHOOTING.md explain each code"


def configuration_message(check_id: str, code: str, setting: str, message: str) -> checks.CheckMessage:
    """One configuration problem as a check message; ``problem`` on it is what entry points print."""
    level = checks.Error if settings.PRODUCTION else checks.Warning
    found: checks.CheckMessage = level(message, hint=HINT, obj=setting, id=check_id)
    found.problem = Problem(code, setting, message)  # type: ignore[attr-defined]
    return found


@checks.register(CONFIGURATION)
def configuration_problems(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    problems: list[Problem] = getattr(settings, "MODELFORGE_CONFIG_PROBLEMS", [])
    return [
        configuration_message(f"modelforge.{problem.code}", problem.code, problem.setting, problem.message)
        for problem in problems
    ]


def problem_of(message: checks.CheckMessage) -> Problem | None:
    """The configuration problem a check message carries (``configuration_message``), if any."""
    problem: Problem | None = getattr(message, "problem", None)
    return problem


def all_problems() -> list[Problem]:
    """Every configuration problem: those found reading settings, then each app's rules (app order)."""
    found = (problem_of(message) for message in checks.run_checks(tags=[CONFIGURATION]))
    return [problem for problem in found if problem is not None]
