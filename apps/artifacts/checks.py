"""The artifacts' configuration rule, as a system check (``modelforge.checks``): a local artifact root
never holds ModelForge's secrets. Registered when ``ArtifactsConfig.ready()`` imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import checks

from modelforge.checks import CONFIGURATION, configuration_message
from modelforge.config import INVALID_SETTING

SETTING = "MODELFORGE_ARTIFACT_LOCAL_ROOTS"


@checks.register(CONFIGURATION)
def local_roots(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """artifacts.E001: no root is, holds or lies inside ``<home>/secrets``, judged with every link resolved,
    since that is how a source under it is judged (apps/artifacts/local_roots.py)."""
    home: Path = settings.MODELFORGE_HOME
    secrets = _resolved(home / "secrets")
    found = []
    for root in settings.ARTIFACT_LOCAL_ROOTS:
        real = _resolved(root)
        if real is None or secrets is None:
            found.append(
                configuration_message(
                    "artifacts.E001", INVALID_SETTING, SETTING, f"{root} cannot be resolved"
                )
            )
            continue
        if real == secrets:
            relation = "is the secrets folder"
        elif real in secrets.parents:
            relation = f"contains the secrets folder ({secrets})"
        elif secrets in real.parents:
            relation = f"is inside the secrets folder ({secrets})"
        else:
            continue
        message = (
            f"{root} {relation}; name the folders that hold model weights, not the data folder "
            f"(for example {home / 'imports'})"
        )
        found.append(configuration_message("artifacts.E001", INVALID_SETTING, SETTING, message))
    return found


def _resolved(path: Path) -> Path | None:
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return None
