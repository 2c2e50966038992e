"""Strict reading of ``MODELFORGE_*`` settings, collecting every problem instead of stopping at the first.

django-environ parses the values (URLs, lists, ``<NAME>_FILE`` secrets); this module adds what it does
not do: a bad boolean is an error, not ``False``; a problem is recorded with its code and setting and
reading carries on, so start-up validation can list them all at once.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import environ

MISSING_REQUIRED_SETTING = "MISSING_REQUIRED_SETTING"
INSECURE_PRODUCTION_SETTING = "INSECURE_PRODUCTION_SETTING"
INVALID_SETTING = "INVALID_SETTING"
UNKNOWN_SETTING = "UNKNOWN_SETTING"

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
        "MODELFORGE_TEST_FUZZ_SEED",  # tests/test_api_fuzz.py
        "MODELFORGE_TEST_FUZZ_EXAMPLES",
    }
)

TRUE_STRINGS = frozenset({"1", "true", "yes", "on"})
FALSE_STRINGS = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class Problem:
    """One configuration problem: a code, the setting at fault, and what is wrong and what to do."""

    code: str
    setting: str
    message: str

    def line(self) -> str:
        return f"- [{self.code}] {self.setting}: {self.message}"


class SettingsReader:
    """Reads ``MODELFORGE_*`` variables; every parse failure becomes a ``Problem``, never an exception."""

    def __init__(self, environ_map: dict[str, str] | None = None) -> None:
        self.environ = os.environ if environ_map is None else environ_map
        self.env = environ.FileAwareEnv()
        # FileAwareEnv reads through env.ENVIRON; point it at the mapping we were given.
        self.env.ENVIRON = environ.FileAwareMapping(env=self.environ, cache=False)
        self.problems: list[Problem] = []
        # Every name asked for, with its ``_FILE`` variant: what "known" means for unknown-name reports.
        self.asked: set[str] = set()

    def _ask(self, name: str) -> None:
        self.asked.update((name, f"{name}_FILE"))

    def problem(self, code: str, setting: str, message: str) -> None:
        self.problems.append(Problem(code, setting, message))

    def report_unknown(self) -> None:
        """Record an ``UNKNOWN_SETTING`` for every ``MODELFORGE_*`` name no reader asked for.

        Call it once every setting has been read: "known" is exactly what was asked for, plus the names
        read outside the reader (``KNOWN_ELSEWHERE``); the agent's names are the agent's to judge.
        """
        known = self.asked | KNOWN_ELSEWHERE | CONTROL_PLANE_AGENT_NAMES
        self.problems.extend(unknown_settings(self.environ, known, foreign=(AGENT_PREFIX,)))

    def is_set(self, name: str) -> bool:
        self._ask(name)
        return bool(self.environ.get(name)) or bool(self.environ.get(f"{name}_FILE"))

    def raw(self, name: str) -> str | None:
        """The raw value of ``name``, or of the file named by ``<name>_FILE``; ``None`` when unset."""
        self._ask(name)
        direct = self.environ.get(name)
        file_name = self.environ.get(f"{name}_FILE")
        if direct and file_name:
            self.problem(
                INVALID_SETTING,
                name,
                f"both {name} and {name}_FILE are set; set exactly one of them",
            )
            return None
        if file_name:
            try:
                value = self.env.str(name)
            except (OSError, environ.ImproperlyConfigured) as exc:
                reason = getattr(exc, "strerror", None) or str(exc)
                self.problem(
                    INVALID_SETTING,
                    f"{name}_FILE",
                    f"cannot read secret file {file_name!r} ({reason}); mount the file or fix the path",
                )
                return None
            return value.strip()
        return direct if direct else None

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        return default if value is None else value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in TRUE_STRINGS:
            return True
        if lowered in FALSE_STRINGS:
            return False
        self.problem(
            INVALID_SETTING,
            name,
            f"{value!r} is not a boolean; use one of true/false, yes/no, on/off, 1/0",
        )
        return default

    def integer(
        self, name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = int(value.strip())
        except ValueError:
            self.problem(INVALID_SETTING, name, f"{value!r} is not a whole number")
            return default
        if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            self.problem(INVALID_SETTING, name, f"{number} is out of range; use a value {bounds}")
            return default
        return number

    def fraction(self, name: str, default: float) -> float:
        """A share strictly between 0 and 1 (``0.5``)."""
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = float(value.strip())
        except ValueError:
            self.problem(INVALID_SETTING, name, f"{value!r} is not a number")
            return default
        if not 0 < number < 1:
            self.problem(INVALID_SETTING, name, f"{number} is out of range; use a share between 0 and 1")
            return default
        return number

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.raw(name)
        if value is None:
            return default
        if value not in choices:
            self.problem(INVALID_SETTING, name, f"{value!r} is not one of {', '.join(choices)}")
            return default
        return value

    def csv(self, name: str, default: list[str]) -> list[str]:
        value = self.raw(name)
        if value is None:
            return list(default)
        return [item.strip() for item in value.split(",") if item.strip()]

    def paths(self, name: str) -> list[Path]:
        """Absolute paths, comma separated; empty when unset. A relative entry is a problem and left out:
        it would mean a different folder in each process's working directory."""
        found: list[Path] = []
        for item in self.csv(name, []):
            if "\x00" in item or not os.path.isabs(item):
                self.problem(
                    INVALID_SETTING,
                    name,
                    f"{item!r} is not an absolute path; give absolute paths, comma separated",
                )
            else:
                found.append(Path(item))
        return found

    def url(self, name: str, default: str | None, *, schemes: tuple[str, ...]) -> str | None:
        """A URL whose scheme is one of ``schemes`` and that names a host (or a socket path)."""
        value = self.raw(name)
        if value is None:
            return default
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 -- raises ValueError on a port that is not a number
        except ValueError as exc:
            self.problem(INVALID_SETTING, name, f"not a valid URL ({exc}); expected {schemes[0]}://...")
            return default
        if parts.scheme not in schemes:
            self.problem(
                INVALID_SETTING,
                name,
                f"scheme {parts.scheme or '(none)'!r} is not supported; use one of {', '.join(schemes)}",
            )
            return default
        if not parts.hostname and "host=" not in parts.query:
            self.problem(INVALID_SETTING, name, "the URL names no host; expected scheme://user@host:port/...")
            return default
        return value

    def database(self, name: str, default: str | None) -> dict[str, Any] | None:
        url = self.url(name, default, schemes=("postgres", "postgresql", "pgsql"))
        if url is None:
            return None
        config: dict[str, Any] = environ.Env.db_url_config(url)
        if not config.get("NAME"):
            self.problem(INVALID_SETTING, name, "the URL names no database; append /<database name>")
        return config


def unknown_settings(
    environ_map: Mapping[str, str],
    known: Iterable[str],
    *,
    prefix: str = PREFIX,
    foreign: Iterable[str] = (),
) -> list[Problem]:
    """An ``UNKNOWN_SETTING`` problem for each ``prefix`` name in ``environ_map`` that is not ``known``.

    A misspelt name (``MODELFORGE_HEARTBEAT_INTERVL``) would otherwise be ignored silently and its default
    used; the message names the closest known name. Names starting with one of the ``foreign`` prefixes
    belong to another program (the agent's ``MODELFORGE_AGENT_*``) and are left to it.
    """
    known_names = set(known)
    foreign_prefixes = tuple(foreign)
    candidates = sorted(known_names)
    problems = []
    for name in sorted(environ_map):
        if not name.startswith(prefix) or name in known_names:
            continue
        if foreign_prefixes and name.startswith(foreign_prefixes):
            continue
        close = closest(name, candidates, prefix)
        hint = f"did you mean {close}?" if close else "no setting of that name exists"
        problems.append(
            Problem(
                UNKNOWN_SETTING,
                name,
                f"is not a ModelForge setting and is ignored; {hint} (docs/CONFIGURATION.md lists them all)",
            )
        )
    return problems


def closest(name: str, candidates: Iterable[str], prefix: str) -> str | None:
    """The known name most like ``name``, compared without the shared prefix (which would make every
    name look alike), or ``None`` when none is close."""
    by_suffix = {candidate.removeprefix(prefix): candidate for candidate in candidates}
    found = difflib.get_close_matches(name.removeprefix(prefix), sorted(by_suffix), n=1, cutoff=0.6)
    return by_suffix[found[0]] if found else None
