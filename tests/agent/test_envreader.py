"""The one settings reader of the agent and the control plane (agent/envreader.py): the same rules on both
sides, and nothing but the standard library (the agent runs it standalone)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.envreader import INVALID_SETTING, EnvReader, Program
from agent.settings import AGENT, load_settings
from modelforge.config import CONTROL_PLANE, SettingsReader

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("program", [AGENT, CONTROL_PLANE], ids=["agent", "control-plane"])
def test_an_empty_file_is_refused_on_both_sides_and_never_passes_for_a_value(
    program: Program, tmp_path: Path
) -> None:
    empty = tmp_path / "secret"
    empty.write_text("\n")
    name = f"{program.prefix}CLUSTER_SECRET"
    read = EnvReader({f"{name}_FILE": str(empty)}, program)

    assert read.string(name) is None
    assert read.is_set(name)  # so no MISSING_REQUIRED_SETTING besides: the file is the problem
    assert [(p.code, p.setting) for p in read.problems] == [(INVALID_SETTING, f"{name}_FILE")]
    assert "is empty" in read.problems[0].message


@pytest.mark.parametrize("program", [AGENT, CONTROL_PLANE], ids=["agent", "control-plane"])
def test_choices_are_exact_on_both_sides_and_a_miscased_value_is_told_the_right_case(
    program: Program,
) -> None:
    read = EnvReader({f"{program.prefix}LOG_LEVEL": "debug"}, program)

    assert read.choice(f"{program.prefix}LOG_LEVEL", "INFO", ("DEBUG", "INFO")) == "INFO"
    assert [p.message for p in read.problems] == [
        "'debug' is not one of DEBUG, INFO (values are case-sensitive: use 'DEBUG')"
    ]


def test_surrounding_whitespace_is_removed_and_only_whitespace_is_unset() -> None:
    read = SettingsReader({"MODELFORGE_PORT": " 8001 \n", "MODELFORGE_SECRET_KEY": "   "})

    assert read.integer("MODELFORGE_PORT", 8000) == 8001
    assert read.string("MODELFORGE_SECRET_KEY") is None
    assert not read.is_set("MODELFORGE_SECRET_KEY")
    assert read.problems == []


def test_a_file_is_read_verbatim(tmp_path: Path) -> None:
    # django-environ, which read the control plane's files before, took a leading '$' as the name of
    # another variable to read instead.
    secret = tmp_path / "key"
    secret.write_text("$HOME-is-part-of-this-secret\n")

    read = SettingsReader({"MODELFORGE_SECRET_KEY_FILE": str(secret), "HOME": "/root"})

    assert read.string("MODELFORGE_SECRET_KEY") == "$HOME-is-part-of-this-secret"
    assert read.problems == []


def test_a_file_that_is_not_utf8_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_bytes(b"\xff\xfe")

    read = SettingsReader({"MODELFORGE_SECRET_KEY_FILE": str(secret)})

    assert read.string("MODELFORGE_SECRET_KEY") is None
    assert [(p.code, p.setting) for p in read.problems] == [(INVALID_SETTING, "MODELFORGE_SECRET_KEY_FILE")]


def test_a_urls_password_is_never_echoed() -> None:
    read = SettingsReader({"MODELFORGE_REDIS_URL": "http://user:hunter2@redis:6379/0"})

    assert read.url("MODELFORGE_REDIS_URL", None, schemes=("redis", "rediss")) is None
    assert "hunter2" not in read.problems[0].message
    assert read.problems[0].message.startswith("scheme 'http' is not supported; 'http://user:***@redis")


def test_the_agent_refuses_a_miscased_choice_it_used_to_lower(agent_env: dict[str, str]) -> None:
    agent_env["MODELFORGE_AGENT_ACCELERATOR_MODE"] = "CPU"

    settings, problems = load_settings(agent_env)

    assert settings is None
    assert [p.line() for p in problems] == [
        "- [INVALID_SETTING] MODELFORGE_AGENT_ACCELERATOR_MODE: 'CPU' is not one of auto, nvidia, cpu "
        "(values are case-sensitive: use 'cpu')"
    ]


def test_the_reader_imports_only_the_standard_library() -> None:
    code = (
        "import sys, agent.envreader, agent.settings\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'django', 'environ', 'modelforge', 'apps', 'msgspec', 'httpx'})\n"
        "print(bad)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
