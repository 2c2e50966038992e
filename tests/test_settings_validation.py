"""Start-up validation: every problem collected, each with its code and setting."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from modelforge import startup
from modelforge.config import (
    INSECURE_PRODUCTION_SETTING,
    INVALID_SETTING,
    MISSING_REQUIRED_SETTING,
    UNKNOWN_SETTING,
    SettingsReader,
)

STRONG_SECRET = "s" * 64
STRONG_KEY = "k" * 40


def problems_for(env: dict[str, str], *, production: bool = True) -> list[tuple[str, str]]:
    """Run the same reading the settings module does, over ``env``, and return (code, setting) pairs."""
    read = SettingsReader(env)
    debug = read.boolean("MODELFORGE_DEBUG", not production)
    database = read.database("MODELFORGE_DATABASE_URL", None)
    redis_url = read.url("MODELFORGE_REDIS_URL", None, schemes=("redis", "rediss", "unix"))
    read.integer("MODELFORGE_PORT", 8000, minimum=1, maximum=65535)
    hosts = read.csv("MODELFORGE_ALLOWED_HOSTS", [])
    problems = startup.collect_problems(
        read,
        production=production,
        secret_key=read.string("MODELFORGE_SECRET_KEY"),
        debug=debug,
        allowed_hosts=hosts,
        operator_api_key=read.string("MODELFORGE_OPERATOR_API_KEY"),
        database=database,
        redis_url=redis_url,
        cluster_secret=read.string("MODELFORGE_CLUSTER_SECRET"),
    )
    return [(p.code, p.setting) for p in problems]


def good_production_env(**changes: str) -> dict[str, str]:
    env = {
        "MODELFORGE_SECRET_KEY": STRONG_SECRET,
        "MODELFORGE_OPERATOR_API_KEY": STRONG_KEY,
        "MODELFORGE_DATABASE_URL": "postgres://modelforge:Xk29-long-unique@db:5432/modelforge",
        "MODELFORGE_REDIS_URL": "redis://redis:6379/0",
        "MODELFORGE_ALLOWED_HOSTS": "modelforge.example.org",
        "MODELFORGE_CLUSTER_SECRET": "c" * 32,
    }
    env.update(changes)
    return env


def test_a_complete_production_configuration_has_no_problems():
    assert problems_for(good_production_env()) == []


def test_it_collects_every_problem_instead_of_stopping_at_the_first():
    env = good_production_env(
        MODELFORGE_DATABASE_URL="postgres://modelforge:postgres@db:5432/modelforge",
        MODELFORGE_DEBUG="true",
        MODELFORGE_ALLOWED_HOSTS="*",
        MODELFORGE_SECRET_KEY="short",
    )
    del env["MODELFORGE_OPERATOR_API_KEY"]
    assert sorted(problems_for(env)) == sorted(
        [
            (MISSING_REQUIRED_SETTING, "MODELFORGE_OPERATOR_API_KEY"),
            (INSECURE_PRODUCTION_SETTING, "MODELFORGE_DATABASE_URL"),
            (INSECURE_PRODUCTION_SETTING, "MODELFORGE_DEBUG"),
            (INSECURE_PRODUCTION_SETTING, "MODELFORGE_ALLOWED_HOSTS"),
            (INSECURE_PRODUCTION_SETTING, "MODELFORGE_SECRET_KEY"),
        ]
    )


def test_production_requires_its_stores_hosts_and_secrets():
    assert sorted(problems_for({})) == sorted(
        (MISSING_REQUIRED_SETTING, name)
        for name in (
            "MODELFORGE_SECRET_KEY",
            "MODELFORGE_OPERATOR_API_KEY",
            "MODELFORGE_CLUSTER_SECRET",
            "MODELFORGE_DATABASE_URL",
            "MODELFORGE_REDIS_URL",
            "MODELFORGE_ALLOWED_HOSTS",
        )
    )


@pytest.mark.parametrize("key", [startup.DEVELOPMENT_SECRET_KEY, "django-insecure-" + "a" * 60])
def test_a_published_secret_key_is_insecure(key):
    assert (INSECURE_PRODUCTION_SETTING, "MODELFORGE_SECRET_KEY") in problems_for(
        good_production_env(MODELFORGE_SECRET_KEY=key)
    )


def test_a_short_operator_key_is_insecure():
    assert problems_for(good_production_env(MODELFORGE_OPERATOR_API_KEY="tooshort")) == [
        (INSECURE_PRODUCTION_SETTING, "MODELFORGE_OPERATOR_API_KEY")
    ]


@pytest.mark.parametrize("password", ["postgres", "Password", "modelforge", "changeme"])
def test_a_well_known_database_password_is_insecure(password):
    url = f"postgres://modelforge:{password}@db:5432/modelforge"
    assert problems_for(good_production_env(MODELFORGE_DATABASE_URL=url)) == [
        (INSECURE_PRODUCTION_SETTING, "MODELFORGE_DATABASE_URL")
    ]


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "tru"])
def test_a_bad_boolean_is_invalid_and_named(value):
    assert problems_for(good_production_env(MODELFORGE_DEBUG=value)) == [
        (INVALID_SETTING, "MODELFORGE_DEBUG")
    ]


@pytest.mark.parametrize("value", ["true", "YES", "on", "1", "false", "No", "off", "0"])
def test_well_formed_booleans_parse(value):
    read = SettingsReader({"MODELFORGE_DEBUG": value})
    assert read.boolean("MODELFORGE_DEBUG", default=None) == (value.lower() in {"true", "yes", "on", "1"})  # type: ignore[arg-type]
    assert read.problems == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MODELFORGE_DATABASE_URL", "not a url"),
        ("MODELFORGE_DATABASE_URL", "mysql://user:pw@db/modelforge"),
        ("MODELFORGE_DATABASE_URL", "postgres://user:pw@db:notaport/modelforge"),
        ("MODELFORGE_DATABASE_URL", "postgres://user:pw@db:5432/"),
        ("MODELFORGE_REDIS_URL", "http://redis:6379/0"),
        ("MODELFORGE_REDIS_URL", "redis://"),
    ],
)
def test_a_bad_url_is_invalid_and_named(name, value):
    assert problems_for(good_production_env(**{name: value})) == [(INVALID_SETTING, name)]


@pytest.mark.parametrize("value", ["eighty", "0", "70000"])
def test_a_bad_port_is_invalid_and_named(value):
    assert problems_for(good_production_env(MODELFORGE_PORT=value)) == [(INVALID_SETTING, "MODELFORGE_PORT")]


def test_an_unknown_environment_is_invalid():
    read = SettingsReader({"MODELFORGE_ENV": "staging"})
    assert read.choice("MODELFORGE_ENV", "development", ("development", "production")) == "development"
    assert [(p.code, p.setting) for p in read.problems] == [(INVALID_SETTING, "MODELFORGE_ENV")]


def test_secrets_can_come_from_files(tmp_path: Path):
    key_file = tmp_path / "operator-key"
    key_file.write_text(STRONG_KEY + "\n")
    env = good_production_env(MODELFORGE_OPERATOR_API_KEY_FILE=str(key_file))
    del env["MODELFORGE_OPERATOR_API_KEY"]
    read = SettingsReader(env)
    assert read.string("MODELFORGE_OPERATOR_API_KEY") == STRONG_KEY
    assert problems_for(env) == []


def test_an_unreadable_secret_file_is_invalid_and_named(tmp_path: Path):
    env = good_production_env(MODELFORGE_OPERATOR_API_KEY_FILE=str(tmp_path / "missing"))
    del env["MODELFORGE_OPERATOR_API_KEY"]
    found = problems_for(env)
    assert (INVALID_SETTING, "MODELFORGE_OPERATOR_API_KEY_FILE") in found


def test_a_secret_set_both_ways_is_invalid_and_nothing_else(tmp_path: Path):
    key_file = tmp_path / "key"
    key_file.write_text(STRONG_SECRET)
    env = good_production_env(MODELFORGE_SECRET_KEY_FILE=str(key_file))
    assert problems_for(env) == [(INVALID_SETTING, "MODELFORGE_SECRET_KEY")]


def test_an_empty_secret_file_is_invalid_and_named(tmp_path: Path):
    """It was read as an empty key: neither missing (the _FILE was set) nor judged (empty), so production
    started on the published development key. The agent refused an empty file already; both do now."""
    key_file = tmp_path / "key"
    key_file.write_text("\n")
    env = good_production_env(MODELFORGE_SECRET_KEY_FILE=str(key_file))
    del env["MODELFORGE_SECRET_KEY"]
    assert problems_for(env) == [(INVALID_SETTING, "MODELFORGE_SECRET_KEY_FILE")]


def test_development_reports_the_same_secret_problems_but_not_its_own_defaults():
    env = {"MODELFORGE_DATABASE_URL": "postgres://modelforge:postgres@127.0.0.1:5432/modelforge"}
    assert sorted(problems_for(env, production=False)) == sorted(
        [
            (MISSING_REQUIRED_SETTING, "MODELFORGE_SECRET_KEY"),
            (MISSING_REQUIRED_SETTING, "MODELFORGE_OPERATOR_API_KEY"),
            (MISSING_REQUIRED_SETTING, "MODELFORGE_CLUSTER_SECRET"),
            (INSECURE_PRODUCTION_SETTING, "MODELFORGE_DATABASE_URL"),
        ]
    )


def test_the_refusal_text_has_the_header_and_one_line_per_problem():
    read = SettingsReader({})
    read.problem(MISSING_REQUIRED_SETTING, "MODELFORGE_X", "set it")
    read.problem(INVALID_SETTING, "MODELFORGE_Y", "fix it")
    assert startup.refusal_text(read.problems).splitlines() == [
        "ModelForge refused to start: 2 configuration problem(s) must be resolved.",
        "- [MISSING_REQUIRED_SETTING] MODELFORGE_X: set it",
        "- [INVALID_SETTING] MODELFORGE_Y: fix it",
    ]


def test_a_short_cluster_secret_is_insecure():
    assert problems_for(good_production_env(MODELFORGE_CLUSTER_SECRET="short")) == [
        (INSECURE_PRODUCTION_SETTING, "MODELFORGE_CLUSTER_SECRET")
    ]


@pytest.mark.parametrize("value", ["half", "0", "1", "1.5", "-0.2"])
def test_a_mass_loss_fraction_outside_zero_to_one_is_invalid_and_named(value):
    read = SettingsReader({"MODELFORGE_LIVENESS_MASS_LOSS_FRACTION": value})
    assert read.fraction("MODELFORGE_LIVENESS_MASS_LOSS_FRACTION", 0.5) == 0.5
    assert [(p.code, p.setting) for p in read.problems] == [
        (INVALID_SETTING, "MODELFORGE_LIVENESS_MASS_LOSS_FRACTION")
    ]


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("10.0.0.1/8", "did you mean 10.0.0.0/8?"),
        ("*", "0.0.0.0/0,::/0"),
        ("proxy.internal", "addresses or networks"),
        ("10.0.0.300", "addresses or networks"),
    ],
)
def test_a_trusted_proxy_that_is_not_an_address_or_network_is_invalid_and_named(value, hint):
    read = SettingsReader({"MODELFORGE_TRUSTED_PROXIES": f"127.0.0.1, {value}"})
    assert read.networks("MODELFORGE_TRUSTED_PROXIES", []) == [ipaddress.ip_network("127.0.0.1")]
    (problem,) = read.problems
    assert (problem.code, problem.setting) == (INVALID_SETTING, "MODELFORGE_TRUSTED_PROXIES")
    assert repr(value) in problem.message and hint in problem.message


def test_trusted_proxies_parse_and_none_are_trusted_by_default():
    read = SettingsReader({"MODELFORGE_TRUSTED_PROXIES": "10.0.0.5, 172.16.0.0/12,fd00::/8"})
    assert [str(n) for n in read.networks("MODELFORGE_TRUSTED_PROXIES", [])] == [
        "10.0.0.5/32",
        "172.16.0.0/12",
        "fd00::/8",
    ]
    assert read.problems == []
    assert SettingsReader({}).networks("MODELFORGE_TRUSTED_PROXIES", []) == []


def test_a_bad_trusted_proxy_refuses_a_production_start_by_name():
    from tests.fixtures import PYTHON, process_env, run_command

    env = process_env(MODELFORGE_ENV="production", MODELFORGE_TRUSTED_PROXIES="10.0.0.1/8")
    done = run_command([PYTHON, "manage.py", "check"], env)
    assert done.returncode == 3
    assert "[INVALID_SETTING] MODELFORGE_TRUSTED_PROXIES: '10.0.0.1/8' is not an address or network" in (
        done.stdout + done.stderr
    )


def test_a_mass_loss_fraction_parses():
    read = SettingsReader({"MODELFORGE_LIVENESS_MASS_LOSS_FRACTION": " 0.25 "})
    assert read.fraction("MODELFORGE_LIVENESS_MASS_LOSS_FRACTION", 0.5) == 0.25
    assert read.problems == []


def test_a_listening_gap_not_above_twice_the_sweep_interval_is_refused_by_name(tmp_path: Path):
    """Every sweep would look like the end of an outage and restart every node's grace period."""
    from tests.fixtures import PYTHON, process_env, run_command

    env = process_env(MODELFORGE_ENV="production", MODELFORGE_LISTENING_GAP="10",
                      MODELFORGE_LIVENESS_SWEEP_INTERVAL="5")  # fmt: skip
    done = run_command([PYTHON, "manage.py", "check"], env)
    assert done.returncode == 3
    assert (
        "[INVALID_SETTING] MODELFORGE_LISTENING_GAP: 10 s must be more than twice"
        in done.stdout + done.stderr
    )


# --- Unknown names (issue 16: MODELFORGE_HEARTBEAT_INTERVL and MODELFORGE_PROT were silently ignored) ----

# Misspellings these tests and the docs use on purpose; every other name in the repository must be known.
DELIBERATE_MISSPELLINGS = {
    "MODELFORGE_HEARTBEAT_INTERVL",
    "MODELFORGE_PROT",
    "MODELFORGE_SECRET_KEY_FIEL",
    "MODELFORGE_NO_SUCH_THING",
    "MODELFORGE_AGENT_HEARTBEAT_INTERVL",
    "MODELFORGE_AGENT_PROT",
}
# Not environment variables: the settings attribute holding the problems, and a problem's placeholder names.
NOT_VARIABLES = {"MODELFORGE_CONFIG_PROBLEMS", "MODELFORGE_X", "MODELFORGE_Y", "MODELFORGE_AGENT"}


def unknown_for(env: dict[str, str]) -> list[str]:
    read = SettingsReader(env)
    read.integer("MODELFORGE_HEARTBEAT_INTERVAL", 10)
    read.integer("MODELFORGE_PORT", 8000)
    read.string("MODELFORGE_SECRET_KEY")
    read.report_unknown()
    return [problem.line() for problem in read.problems if problem.code == UNKNOWN_SETTING]


def test_an_unknown_name_is_reported_with_the_closest_known_name():
    assert unknown_for({"MODELFORGE_HEARTBEAT_INTERVL": "5", "MODELFORGE_PROT": "9000"}) == [
        "- [UNKNOWN_SETTING] MODELFORGE_HEARTBEAT_INTERVL: is not a ModelForge setting and is ignored; "
        "did you mean MODELFORGE_HEARTBEAT_INTERVAL? (docs/CONFIGURATION.md lists them all)",
        "- [UNKNOWN_SETTING] MODELFORGE_PROT: is not a ModelForge setting and is ignored; "
        "did you mean MODELFORGE_PORT? (docs/CONFIGURATION.md lists them all)",
    ]


def test_a_name_like_no_setting_gets_no_guess_and_a_misspelt_file_variant_gets_its_own():
    lines = unknown_for({"MODELFORGE_NO_SUCH_THING": "1", "MODELFORGE_SECRET_KEY_FIEL": "/run/secrets/k"})
    assert (
        "MODELFORGE_NO_SUCH_THING: is not a ModelForge setting and is ignored; no setting of that name"
        in (lines[0])
    )
    assert "did you mean MODELFORGE_SECRET_KEY_FILE?" in lines[1]


def test_file_variants_names_read_elsewhere_and_the_agents_names_are_not_reported(tmp_path: Path):
    secret = tmp_path / "key"
    secret.write_text("k" * 64)
    env = {
        "MODELFORGE_SECRET_KEY_FILE": str(secret),
        "MODELFORGE_TEST_HOME": "/tmp/x",
        "MODELFORGE_LOCAL_AGENT": "false",
        "MODELFORGE_DATABASE_PASSWORD": "p",
        "MODELFORGE_AGENT_PORT": "8471",
        "MODELFORGE_AGENT_HEARTBEAT_INTERVL": "3",  # the agent's to judge (tests/agent/test_settings.py)
        "OTHER_PROGRAM_PROT": "1",
    }
    assert unknown_for(env) == []


def test_nothing_in_the_test_environment_is_unknown():
    from django.conf import settings

    assert [p.line() for p in settings.MODELFORGE_CONFIG_PROBLEMS if p.code == UNKNOWN_SETTING] == []


def test_every_name_the_repository_uses_is_known_to_the_control_plane_or_the_agent():
    """Compose, the Makefile, the dev stack, the benches, the tests and the docs set only real names."""
    import re

    from agent.settings import KNOWN_ELSEWHERE as AGENT_KNOWN_ELSEWHERE
    from agent.settings import _Reader, load_settings
    from modelforge import settings as settings_module
    from modelforge.config import CONTROL_PLANE_AGENT_NAMES, KNOWN_ELSEWHERE

    agent_reader_asked: set[str] = set()
    original_raw = _Reader.raw

    def recording_raw(self: _Reader, name: str) -> str | None:
        agent_reader_asked.update((name, f"{name}_FILE"))
        return original_raw(self, name)

    _Reader.raw = recording_raw  # type: ignore[method-assign]
    try:
        load_settings({})
    finally:
        _Reader.raw = original_raw  # type: ignore[method-assign]
    known = (
        settings_module.read.asked
        | KNOWN_ELSEWHERE
        | CONTROL_PLANE_AGENT_NAMES
        | agent_reader_asked
        | AGENT_KNOWN_ELSEWHERE
    )
    root = Path(__file__).resolve().parent.parent
    files = [root / "Makefile", *root.glob("compose/*.y*ml"), *root.glob("docs/*.md"), root / "README.md"]
    for folder in ("modelforge", "apps", "agent", "tests", "bench"):
        files += [p for p in (root / folder).rglob("*") if p.suffix in (".py", ".md", ".sh", ".yaml")]
    used: dict[str, str] = {}
    for path in files:
        for name in re.findall(
            r"MODELFORGE_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*])", path.read_text(errors="replace")
        ):
            used.setdefault(name, str(path.relative_to(root)))
    unknown = {
        name: where
        for name, where in used.items()
        if name not in known | DELIBERATE_MISSPELLINGS | NOT_VARIABLES
    }
    assert unknown == {}


def test_an_apps_configuration_check_refuses_production_at_entry_with_its_code(capsys):
    """The rules over an app's settings are that app's system checks; entry points refuse them the same."""
    from django.test import override_settings

    with (
        override_settings(PRODUCTION=True, LB_BASE_BENCH_S=60, LB_MAX_BENCH_S=30),
        pytest.raises(SystemExit) as exit,
    ):
        startup.enforce("test")
    assert exit.value.code == startup.EXIT_REFUSED
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith(
            "- [INVALID_SETTING] MODELFORGE_LB_MAX_BENCH_S: 30 s is shorter than MODELFORGE_LB_BASE_BENCH_S"
        )
    )


def test_production_refuses_an_unknown_name_and_development_reports_it_as_a_system_check():
    from tests.fixtures import PYTHON, process_env, run_command

    refused = run_command([PYTHON, "manage.py", "check"], process_env(MODELFORGE_ENV="production",
                          MODELFORGE_ALLOWED_HOSTS="modelforge.lan", MODELFORGE_PROT="9000"))  # fmt: skip
    assert refused.returncode == 3
    assert (
        "- [UNKNOWN_SETTING] MODELFORGE_PROT: is not a ModelForge setting and is ignored; "
        "did you mean MODELFORGE_PORT?" in refused.stderr
    )

    logged = run_command([PYTHON, "manage.py", "check"], process_env(MODELFORGE_HEARTBEAT_INTERVL="5"))
    assert logged.returncode == 0, logged.stderr
    assert "WARNING" in logged.stderr
    assert "[UNKNOWN_SETTING] MODELFORGE_HEARTBEAT_INTERVL" in logged.stderr
    assert "System check identified some issues" in logged.stderr
    assert "(modelforge.UNKNOWN_SETTING) is not a ModelForge setting and is ignored; did you mean " in (
        logged.stdout + logged.stderr
    )


@pytest.mark.parametrize(("production", "level"), [(True, "Error"), (False, "Warning")])
def test_configuration_problems_are_system_check_errors_in_production_and_warnings_in_development(
    production: bool, level: str
):
    from django.core import checks
    from django.test import override_settings

    from modelforge.checks import configuration_problems
    from modelforge.config import Problem

    problem = Problem(UNKNOWN_SETTING, "MODELFORGE_PROT", "is not a ModelForge setting")
    with override_settings(MODELFORGE_CONFIG_PROBLEMS=[problem], PRODUCTION=production):
        found = checks.run_checks(tags=["modelforge"])
        assert configuration_problems() == found
    assert [(type(m).__name__, m.id, m.obj, m.msg) for m in found] == [
        (level, "modelforge.UNKNOWN_SETTING", "MODELFORGE_PROT", "is not a ModelForge setting")
    ]
