"""Start-up steps 1 and 2: settings read strictly with every problem collected; a writable home."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.app import run
from agent.settings import load_settings
from tests.agent.fakes import fake_pynvml
from tests.agent.support import RecordingControlPlane

HEADER = "modelforge-agent refused to start: {n} configuration problem(s) must be resolved."


def test_it_lists_every_missing_setting_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = run({"HOME": str(tmp_path), "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state")})

    err = capsys.readouterr().err
    assert status == 3
    assert err.splitlines()[0] == HEADER.format(n=3)
    assert "- [MISSING_REQUIRED_SETTING] MODELFORGE_AGENT_CONTROL_PLANE_URL:" in err
    assert "- [MISSING_REQUIRED_SETTING] MODELFORGE_AGENT_ENROLLMENT_TOKEN:" in err
    assert "- [MISSING_REQUIRED_SETTING] MODELFORGE_AGENT_CLUSTER_SECRET:" in err


@pytest.mark.parametrize(
    "url",
    [
        "https://modelforge.example.com",
        "http://control-plane.example.org:8000",
        "https://changeme:8000",
        "https://your-control-plane:8000",
        "http://<control-plane-host>:8000",
        "https://placeholder.lan",
        "http://localhost.invalid",
        "https://modelforge.example",
    ],
)
def test_it_names_a_placeholder_control_plane_url(
    url: str,
    agent_env: dict[str, str],
    control_plane: RecordingControlPlane,
    capsys: pytest.CaptureFixture[str],
) -> None:
    agent_env["MODELFORGE_AGENT_CONTROL_PLANE_URL"] = url

    status = run(agent_env)

    err = capsys.readouterr().err
    assert status == 3
    assert "- [PLACEHOLDER_CONTROL_PLANE_URL] MODELFORGE_AGENT_CONTROL_PLANE_URL:" in err
    assert control_plane.requests == []


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "ftp://modelforge.lan", "not an http:// or https:// URL"),
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "https://modelforge.lan:port", "not a valid URL"),
        ("MODELFORGE_AGENT_ACCELERATOR_MODE", "gpu", "is not one of auto, nvidia, cpu"),
        ("MODELFORGE_AGENT_CLUSTER_SECRET", "too-short", "at least 16 characters"),
        ("MODELFORGE_AGENT_PORT", "70000", "between 1 and 65535"),
        ("MODELFORGE_AGENT_HEARTBEAT_INTERVAL", "0", "between 1 and 300"),
        ("MODELFORGE_AGENT_HEARTBEAT_INTERVAL", "301", "between 1 and 300"),
        ("MODELFORGE_AGENT_HEARTBEAT_INTERVAL", "ten", "not a whole number"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "relative/state", "not an absolute path"),
        ("MODELFORGE_AGENT_ADVERTISE_HOST", "0.0.0.0", "a listening address"),
        ("MODELFORGE_AGENT_NAME", "gpu 01", "is not a node name"),
        ("MODELFORGE_AGENT_NAME", "n" * 64, "is not a node name"),
    ],
)
def test_it_refuses_an_invalid_value_by_name(
    name: str, value: str, fragment: str, agent_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    agent_env[name] = value

    assert run(agent_env) == 3

    err = capsys.readouterr().err
    assert err.splitlines()[0] == HEADER.format(n=1)
    assert f"- [INVALID_SETTING] {name}: " in err
    assert fragment in err


def test_secrets_may_come_from_files(agent_env: dict[str, str], tmp_path: Path) -> None:
    secret_file = tmp_path / "cluster-secret"
    secret_file.write_text("a-cluster-secret-read-from-a-file\n")
    token_file = tmp_path / "token"
    token_file.write_text("token-from-a-file")
    del agent_env["MODELFORGE_AGENT_CLUSTER_SECRET"], agent_env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"]
    agent_env["MODELFORGE_AGENT_CLUSTER_SECRET_FILE"] = str(secret_file)
    agent_env["MODELFORGE_AGENT_ENROLLMENT_TOKEN_FILE"] = str(token_file)

    settings, problems = load_settings(agent_env)

    assert problems == []
    assert settings is not None
    assert settings.cluster_secret == "a-cluster-secret-read-from-a-file"
    assert settings.enrollment_token == "token-from-a-file"


def test_a_secret_file_that_cannot_be_read_is_named_once(agent_env: dict[str, str], tmp_path: Path) -> None:
    del agent_env["MODELFORGE_AGENT_CLUSTER_SECRET"]
    agent_env["MODELFORGE_AGENT_CLUSTER_SECRET_FILE"] = str(tmp_path / "missing")

    _, problems = load_settings(agent_env)

    assert [(p.code, p.setting) for p in problems] == [
        ("INVALID_SETTING", "MODELFORGE_AGENT_CLUSTER_SECRET_FILE")
    ]


def test_defaults_follow_the_state_volume_and_the_hostname(agent_env: dict[str, str]) -> None:
    for name in ("MODELFORGE_AGENT_NAME", "MODELFORGE_AGENT_ADVERTISE_HOST", "MODELFORGE_AGENT_PORT"):
        del agent_env[name]

    settings, _ = load_settings(agent_env)

    assert settings is not None
    assert settings.models_dir == Path(agent_env["MODELFORGE_AGENT_STATE_VOLUME"]) / "models"
    assert settings.port == 8471
    assert settings.heartbeat_interval_s == 1
    assert settings.accelerator_mode == "cpu"
    assert settings.name == settings.advertise_host != ""
    assert settings.agent_url == f"http://{settings.advertise_host}:8471"


def test_the_token_is_not_required_once_an_identity_exists(agent_env: dict[str, str]) -> None:
    del agent_env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"]
    state = Path(agent_env["MODELFORGE_AGENT_STATE_VOLUME"])
    state.mkdir()
    (state / "identity.json").write_text("{}")

    _, problems = load_settings(agent_env)

    assert problems == []


def test_an_unwritable_home_is_refused_before_any_engine_or_nvml(
    agent_env: dict[str, str],
    control_plane: RecordingControlPlane,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Root can write anywhere it has a directory: a path under a regular file fails even for root.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    agent_env["HOME"] = str(blocker / "home")
    agent_env["MODELFORGE_AGENT_ACCELERATOR_MODE"] = "nvidia"
    nvml = fake_pynvml(init_error="must not be reached")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    status = run(agent_env)

    err = capsys.readouterr().err
    assert status == 3
    assert err.splitlines()[0] == HEADER.format(n=1)
    assert f"- [AGENT_HOME_NOT_WRITABLE] HOME: {blocker / 'home'} is not writable" in err
    assert "permission error on a cache path" in err
    assert nvml.calls.init == 0
    assert control_plane.requests == []


def test_an_unwritable_state_volume_is_named(
    agent_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    agent_env["MODELFORGE_AGENT_STATE_VOLUME"] = str(blocker / "state")

    assert run(agent_env) == 3

    assert "- [AGENT_HOME_NOT_WRITABLE] MODELFORGE_AGENT_STATE_VOLUME:" in capsys.readouterr().err


def test_an_unknown_agent_name_is_refused_with_the_closest_known_name(
    agent_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Regression (issue 16): a misspelt setting was ignored and its default used without a word.
    agent_env["MODELFORGE_AGENT_HEARTBEAT_INTERVL"] = "3"
    agent_env["MODELFORGE_AGENT_PROT"] = "9000"

    status = run(agent_env)

    err = capsys.readouterr().err
    assert status == 3
    assert err.splitlines()[0] == HEADER.format(n=2)
    assert (
        "- [UNKNOWN_SETTING] MODELFORGE_AGENT_HEARTBEAT_INTERVL: is not a modelforge-agent setting and is "
        "ignored; did you mean MODELFORGE_AGENT_HEARTBEAT_INTERVAL?" in err
    )
    assert "- [UNKNOWN_SETTING] MODELFORGE_AGENT_PROT:" in err
    assert "did you mean MODELFORGE_AGENT_PORT?" in err


def test_the_control_planes_names_and_file_variants_are_not_unknown_to_the_agent(
    agent_env: dict[str, str], tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(agent_env.pop("MODELFORGE_AGENT_CLUSTER_SECRET"))
    agent_env.update(
        MODELFORGE_AGENT_CLUSTER_SECRET_FILE=str(secret),
        MODELFORGE_AGENT_CALL_TIMEOUT="10",  # the control plane's (make run hands over its environment)
        MODELFORGE_AGENT_SHM_SIZE="8gb",  # Compose's
        MODELFORGE_HEARTBEAT_INTERVL="10",  # the control plane's to judge
    )

    settings, problems = load_settings(agent_env)

    assert problems == []
    assert settings is not None
