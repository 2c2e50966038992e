"""Strict reading of environment settings: the one reader of the node agent and the control plane.

Standard library only, and no import from ``apps/``, ``modelforge/`` or Django: the agent runs it on
its own, and the control plane (``modelforge/config.py``) builds on it. One reading rule for both:

- A value has its surrounding whitespace removed; empty (or only whitespace) is the same as unset.
- Any setting may instead be read from the file named by ``<NAME>_FILE`` (a Docker/Kubernetes secret),
  read verbatim as UTF-8 and stripped. Setting both ``<NAME>`` and ``<NAME>_FILE`` is a problem; so is a
  file that cannot be read, and a file that is empty: an empty secret must never pass for an unset one
  (a default would be used in its place) nor for a set one (a required-setting check would pass).
- Choices are exact, case included: ``'Production'`` is not ``production`` (the message names the
  value meant). Booleans are the one exception: ``true``/``yes``/``on``/``1`` and their opposites, in
  any case.
- Every parse failure becomes a ``Problem`` (code, setting, message) and reading carries on with the
  default, so a refusal lists every problem at once; never an exception.
- Once everything is read, a name under the program's prefix that nothing asked for is
  ``UNKNOWN_SETTING``, naming the closest known name.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

MISSING_REQUIRED_SETTING = "MISSING_REQUIRED_SETTING"
INVALID_SETTING = "INVALID_SETTING"
UNKNOWN_SETTING = "UNKNOWN_SETTING"

TRUE_STRINGS = frozenset({"1", "true", "yes", "on"})
FALSE_STRINGS = frozenset({"0", "false", "no", "off"})

# user:password@ in a URL: the password is never echoed in a problem's message.
_URL_PASSWORD = re.compile(r"(://[^/@:]*:)[^/@]*@")


@dataclass(frozen=True)
class Problem:
    """One configuration problem: a code, the setting at fault, and what is wrong and what to do."""

    code: str
    setting: str
    message: str

    def line(self) -> str:
        return f"- [{self.code}] {self.setting}: {self.message}"


def refusal_text(program: str, problems: list[Problem]) -> str:
    """The header naming ``program`` and the count, then one line per problem."""
    header = f"{program} refused to start: {len(problems)} configuration problem(s) must be resolved."
    return "\n".join([header, *(problem.line() for problem in problems)])


@dataclass(frozen=True)
class Program:
    """Whose settings a reader reads: what its ``UNKNOWN_SETTING`` problems say and leave alone."""

    prefix: str  # every setting's name starts with it: MODELFORGE_ or MODELFORGE_AGENT_
    title: str  # "is not a <title> setting"
    docs: str  # where every setting is listed
    no_match: str  # the hint when no known name is close
    # Names under the prefix that are legitimate but read elsewhere (every name asked for, and its
    # _FILE, is known without being listed).
    known_elsewhere: frozenset[str] = frozenset()
    # Prefixes inside ``prefix`` that belong to another program, which judges them.
    foreign: tuple[str, ...] = ()


def redact(value: str) -> str:
    """``value`` with a URL's password replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", value)


class EnvReader:
    """Reads one environment mapping for one program; a parse failure is a ``Problem``, never raised."""

    def __init__(self, environ: Mapping[str, str], program: Program) -> None:
        self.environ = environ
        self.program = program
        self.problems: list[Problem] = []
        # Every name asked for, with its ``_FILE`` variant: what "known" means for unknown-name reports.
        self.asked: set[str] = set()

    def _ask(self, name: str) -> None:
        self.asked.update((name, f"{name}_FILE"))

    def problem(self, code: str, setting: str, message: str) -> None:
        self.problems.append(Problem(code, setting, message))

    def reported(self, name: str) -> bool:
        """Whether a problem about ``name`` (or its ``_FILE``) was already recorded."""
        return any(problem.setting in (name, f"{name}_FILE") for problem in self.problems)

    def is_set(self, name: str) -> bool:
        """Whether ``name`` or ``<name>_FILE`` has a value (what the file holds is ``raw``'s to judge)."""
        self._ask(name)
        return bool(self.environ.get(name, "").strip() or self.environ.get(f"{name}_FILE", "").strip())

    def raw(self, name: str) -> str | None:
        """The value of ``name`` or of the file named by ``<name>_FILE``; ``None`` when unset or refused."""
        self._ask(name)
        direct = self.environ.get(name, "").strip()
        file_name = self.environ.get(f"{name}_FILE", "").strip()
        if direct and file_name:
            self.problem(
                INVALID_SETTING, name, f"both {name} and {name}_FILE are set; set exactly one of them"
            )
            return None
        if file_name:
            return self._from_file(name, file_name)
        return direct or None

    def _from_file(self, name: str, file_name: str) -> str | None:
        try:
            value = Path(file_name).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            self.problem(
                INVALID_SETTING,
                f"{name}_FILE",
                f"cannot read file {file_name!r} ({reason}); mount the file or fix the path",
            )
            return None
        if not value:
            self.problem(
                INVALID_SETTING,
                f"{name}_FILE",
                f"{file_name!r} is empty; put the value in the file, or unset {name}_FILE",
            )
            return None
        return value

    # --- typed readers: each returns the default when unset or invalid --------------------------------

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        return default if value is None else value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in TRUE_STRINGS:
            return True
        if lowered in FALSE_STRINGS:
            return False
        self.problem(
            INVALID_SETTING, name, f"{value!r} is not a boolean; use one of true/false, yes/no, on/off, 1/0"
        )
        return default

    def integer(
        self, name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = int(value)
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
            number = float(value)
        except ValueError:
            self.problem(INVALID_SETTING, name, f"{value!r} is not a number")
            return default
        if not 0 < number < 1:
            self.problem(INVALID_SETTING, name, f"{number} is out of range; use a share between 0 and 1")
            return default
        return number

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        """One of ``choices``, exactly: case counts (the message names the choice a miscased value means)."""
        value = self.raw(name)
        if value is None:
            return default
        if value not in choices:
            meant = [choice for choice in choices if choice.lower() == value.lower()]
            hint = f" (values are case-sensitive: use {meant[0]!r})" if meant else ""
            self.problem(INVALID_SETTING, name, f"{value!r} is not one of {', '.join(choices)}{hint}")
            return default
        return value

    def csv(self, name: str, default: list[str]) -> list[str]:
        value = self.raw(name)
        if value is None:
            return list(default)
        return [item.strip() for item in value.split(",") if item.strip()]

    def path(self, name: str, default: Path) -> Path:
        """An absolute path (a relative one is a problem, and is returned as given)."""
        value = self.raw(name)
        if value is None:
            return default
        if "\x00" in value or not os.path.isabs(value):
            self.problem(INVALID_SETTING, name, f"{value!r} is not an absolute path")
        return Path(value)

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

    def url(
        self, name: str, default: str | None, *, schemes: tuple[str, ...], expected: str | None = None
    ) -> str | None:
        """A URL whose scheme is one of ``schemes`` and that names a host (or a socket path)."""
        value = self.raw(name)
        if value is None:
            return default
        return value if self.check_url(name, value, schemes=schemes, expected=expected) else default

    def check_url(
        self, name: str, value: str, *, schemes: tuple[str, ...], expected: str | None = None
    ) -> bool:
        """Whether ``value`` is such a URL; if not, the problem is recorded. ``expected`` says what a good
        value is, in words (by default: the schemes). A password in the URL is never echoed."""
        expected = expected or f"a URL with scheme {', '.join(schemes)} and a host"
        shown = redact(value)
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 -- raises ValueError on a port that is not a number
        except ValueError as exc:
            self.problem(INVALID_SETTING, name, f"{shown!r} is not a valid URL ({exc}); expected {expected}")
            return False
        if parts.scheme not in schemes:
            self.problem(
                INVALID_SETTING,
                name,
                f"scheme {parts.scheme or '(none)'!r} is not supported; {shown!r} is not {expected}",
            )
            return False
        if not parts.hostname and "host=" not in parts.query:
            self.problem(INVALID_SETTING, name, f"the URL names no host; {shown!r} is not {expected}")
            return False
        return True

    # --- last, once everything is read -------------------------------------------------------------------

    def report_unknown(self) -> None:
        """An ``UNKNOWN_SETTING`` for each name under the program's prefix that nothing asked for."""
        self.problems.extend(unknown_settings(self.environ, self.asked, self.program))


def unknown_settings(environ: Mapping[str, str], asked: Iterable[str], program: Program) -> list[Problem]:
    """An ``UNKNOWN_SETTING`` problem for each of ``program``'s names in ``environ`` that is not known.

    A misspelt name (``MODELFORGE_HEARTBEAT_INTERVL``) would otherwise be ignored silently and its default
    used; the message names the closest known name. Names under one of ``program.foreign`` belong to
    another program and are left to it.
    """
    known = set(asked) | program.known_elsewhere
    candidates = sorted(known)
    problems = []
    for name in sorted(environ):
        if not name.startswith(program.prefix) or name in known:
            continue
        if program.foreign and name.startswith(program.foreign):
            continue
        close = closest(name, candidates, program.prefix)
        hint = f"did you mean {close}?" if close else program.no_match
        problems.append(
            Problem(
                UNKNOWN_SETTING,
                name,
                f"is not a {program.title} setting and is ignored; {hint} ({program.docs} lists them all)",
            )
        )
    return problems


def closest(name: str, candidates: Iterable[str], prefix: str) -> str | None:
    """The known name most like ``name``, compared without the shared prefix (which would make every
    name look alike), or ``None`` when none is close."""
    by_suffix = {candidate.removeprefix(prefix): candidate for candidate in candidates}
    found = difflib.get_close_matches(name.removeprefix(prefix), sorted(by_suffix), n=1, cutoff=0.6)
    return by_suffix[found[0]] if found else None
