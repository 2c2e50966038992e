"""The writable-home check, run before anything could import a model engine.

Engines (vLLM, torch, Triton, Hugging Face hubs) write caches under ``$HOME`` at import time. An agent
whose home is not writable would start, enroll, look healthy — and its first remote launch would die
with a permission error on a cache path, on that first launch only, which looks intermittent. So the
agent proves it can write there (and on its state volume) before doing anything else.
"""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Mapping
from pathlib import Path

from agent.settings import STATE_VOLUME, AgentSettings, Problem

AGENT_HOME_NOT_WRITABLE = "AGENT_HOME_NOT_WRITABLE"


def home_directory(environ: Mapping[str, str]) -> Path:
    home = environ.get("HOME", "").strip()
    if home:
        return Path(home)
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def write_problem(path: Path) -> str | None:
    """Why ``path`` cannot be written to, or ``None``. Creates the directory when it is missing.

    A real write, not ``os.access``: root passes ``os.access`` on a read-only mount, and a path under
    a regular file fails only when used.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".modelforge-agent-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or exc.__class__.__name__
    return None


def check_writable(settings: AgentSettings, environ: Mapping[str, str]) -> list[Problem]:
    """Every directory the agent or an engine it starts must write to and cannot."""
    problems: list[Problem] = []
    engine_paths = [("HOME", home_directory(environ))]
    if environ.get("XDG_CACHE_HOME", "").strip():
        engine_paths.append(("XDG_CACHE_HOME", Path(environ["XDG_CACHE_HOME"].strip())))
    for setting, path in engine_paths:
        reason = write_problem(path)
        if reason:
            problems.append(
                Problem(
                    AGENT_HOME_NOT_WRITABLE,
                    setting,
                    f"{path} is not writable ({reason}): a model engine would fail at import with a "
                    "permission error on a cache path, on its first launch only; give the agent's user a "
                    "writable home directory (a volume mounted there, or HOME pointing at one)",
                )
            )
    reason = write_problem(settings.state_volume)
    if reason:
        problems.append(
            Problem(
                AGENT_HOME_NOT_WRITABLE,
                STATE_VOLUME,
                f"{settings.state_volume} is not writable ({reason}): the node identity cannot be "
                "persisted; mount a durable, writable volume there",
            )
        )
    return problems
