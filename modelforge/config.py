"""The control plane's reading of ``MODELFORGE_*`` settings: the shared strict reader, plus databases.

The reading rules (whitespace, ``<NAME>_FILE``, exact choices, booleans, every problem collected with its
code) are the agent's too and live in one place, ``agent/envreader.py`` (standard library only, so the
agent stays standalone). This module names the control plane's prefix, its documentation and the names
read outside the reader, and adds what only the control plane parses: database URLs (django-environ).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Mapping
from typing import Any

import environ

from agent.envreader import (
    INVALID_SETTING,
    MISSING_REQUIRED_SETTING,
    UNKNOWN_SETTING,
    EnvReader,
    Problem,
    Program,
)

__all__ = [
    "AGENT_PREFIX",
    "CONTROL_PLANE",
    "CONTROL_PLANE_AGENT_NAMES",
    "INSECURE_PRODUCTION_SETTING",
    "INVALID_SETTING",
    "KNOWN_ELSEWHERE",
    "MISSING_REQUIRED_SETTING",
    "PREFIX",
    "UNKNOWN_SETTING",
    "Problem",
    "SettingsReader",
]

INSECURE_PRODUCTION_SETTING = "INSECURE_PRODUCTION_SETTING"

PREFIX = "MODELFORGE_"
# The agent's own names (agent/settings.py judges them); the control plane reads only the one below.
AGENT_PREFIX = "MODELFORGE_AGENT_"
CONTROL_PLANE_AGENT_NAMES = frozenset({"MODELFORGE_AGENT_CALL_TIMEOUT"})

# ``MODELFORGE_*`` names that are legitimate in the control plane's environment but read outside
# ``SettingsReader``: by the development stack, the tests, the benches and Compose's own interpolation.
# Every name a reader is asked for (and its ``_FILE``) is known without being listed here.
KNOWN_ELSEWHERE = frozenset(
    {
        "MODELFORGE_HOME",  # modelforge/devstack.py, modelforge/embedded.py
        "MODELFORGE_RUN_MARK",  # make run marks what it starts (modelforge/devguard.py)
        "MODELFORGE_EMBEDDED_PG_PORT",
        "MODELFORGE_EMBEDDED_REDIS_PORT",
        "MODELFORGE_LOCAL_AGENT",  # make run: start the local node agent
        "MODELFORGE_DEMO",  # make run: create the demo capability
        "MODELFORGE_WORKER_CONCURRENCY",  # make run: the Celery worker's processes
        "MODELFORGE_DATABASE_PASSWORD",  # compose/*.yaml interpolate it into MODELFORGE_DATABASE_URL
        "MODELFORGE_TEST_HOME",  # make test's throw-away data folder
        "MODELFORGE_TEST_ENGINES",  # make test-engines
        "MODELFORGE_TEST_PAUSE_AT",  # the backup and restore kill tests
        "MODELFORGE_TEST_PG15_URL",  # tests/test_database_compatibility.py
        "MODELFORGE_FUZZ_URL",  # bench/fuzz
        "MODELFORGE_BENCH_LITELLM",  # bench/routing: LiteLLM's own virtual environment
        "MODELFORGE_TEST_FUZZ_SEED",  # tests/test_api_fuzz.py
        "MODELFORGE_TEST_FUZZ_EXAMPLES",
    }
)

CONTROL_PLANE = Program(
    prefix=PREFIX,
    title="ModelForge",
    docs="docs/CONFIGURATION.md",
    no_match="no setting of that name exists",
    known_elsewhere=KNOWN_ELSEWHERE | CONTROL_PLANE_AGENT_NAMES,
    foreign=(AGENT_PREFIX,),
)


class SettingsReader(EnvReader):
    """Reads ``MODELFORGE_*`` variables (``os.environ`` unless given a mapping); every parse failure
    becomes a ``Problem``, never an exception."""

    def __init__(self, environ_map: Mapping[str, str] | None = None) -> None:
        super().__init__(os.environ if environ_map is None else environ_map, CONTROL_PLANE)

    def database(self, name: str, default: str | None) -> dict[str, Any] | None:
        url = self.url(name, default, schemes=("postgres", "postgresql", "pgsql"))
        if url is None:
            return None
        config: dict[str, Any] = environ.Env.db_url_config(url)
        if not config.get("NAME"):
            self.problem(INVALID_SETTING, name, "the URL names no database; append /<database name>")
        return config

    def networks(self, name: str, default: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """Addresses and CIDR networks, comma separated (``10.0.0.5``, ``10.0.0.0/24``, ``fd00::/8``); an
        entry that is neither is a problem and left out. ``*`` is refused: trusting every address is
        written out, ``0.0.0.0/0,::/0``, if it is really meant."""
        found = []
        for item in self.csv(name, default):
            try:
                found.append(ipaddress.ip_network(item))
            except ValueError:
                hint = "give addresses or networks such as 10.0.0.5 or 10.0.0.0/24, comma separated"
                if "/" in item:
                    with contextlib.suppress(ValueError):
                        hint = f"did you mean {ipaddress.ip_network(item, strict=False)}? (host bits are set)"
                elif item == "*":
                    hint = "list the proxies' addresses; to trust every address, write 0.0.0.0/0,::/0"
                self.problem(INVALID_SETTING, name, f"{item!r} is not an address or network: {hint}")
        return found
