"""Start-up step 4: the identity is persisted atomically, reused on restart, and a node enrolls once.

Seeds (Nodes): "Identity is persisted and enrolment is single use. If [the node reappears with a new
identity], the persisted identity file is not on durable storage — check MODELFORGE_AGENT_STATE_VOLUME."
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

import agent.heartbeat
from agent import __version__
from agent.app import run
from agent.identity import Identity, load_identity, save_identity
from tests.agent.support import ENROLLMENT_TOKEN, RecordingControlPlane, error, run_agent


def identity_path(env: dict[str, str]) -> Path:
    return Path(env["MODELFORGE_AGENT_STATE_VOLUME"]) / "identity.json"


def an_identity(**changes: Any) -> Identity:
    values: dict[str, Any] = {
        "node_id": "6f1c1f0e-2a53-4a8e-9d0e-1a2b3c4d5e6f",
        "node_name": "gpu-01",
        "credential": "node-credential-secret",
        "control_plane_url": "http://cp.lan",
        "heartbeat_interval_s": 10,
        "enrolled_at": "2025-01-01T00:00:00+00:00",
    }
    return Identity(**(values | changes))


def test_it_enrolls_once_and_reuses_the_identity_on_restart(
    agent_env: dict[str, str], control_plane: RecordingControlPlane
) -> None:
    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    (enrollment,) = control_plane.enrollments
    assert enrollment.json() == {
        "token": ENROLLMENT_TOKEN,
        "name": "test-node",
        "accelerator": "cpu",
        "agent_version": __version__,
        "agent_url": f"http://127.0.0.1:{agent_env['MODELFORGE_AGENT_PORT']}",
    }
    path = identity_path(agent_env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert (stored["node_id"], stored["credential"]) == (control_plane.node_id, control_plane.credential)

    # Restart, with and without the (spent) token still in the environment.
    heartbeats = len(control_plane.heartbeats)
    assert run_agent(agent_env, until=lambda: len(control_plane.heartbeats) > heartbeats) == 0
    del agent_env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"]
    heartbeats = len(control_plane.heartbeats)
    assert run_agent(agent_env, until=lambda: len(control_plane.heartbeats) > heartbeats) == 0

    assert len(control_plane.enrollments) == 1
    assert {hb.headers["authorization"] for hb in control_plane.heartbeats} == {
        f"Bearer {control_plane.credential}"
    }


def test_a_lost_identity_with_a_used_token_exits_3_naming_the_state_volume(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    control_plane.enroll_answers.append((409, error("ENROLLMENT_TOKEN_USED", "token already used")))

    assert run(agent_env) == 3

    err = capsys.readouterr().err
    assert "modelforge-agent refused to start: [ENROLLMENT_TOKEN_USED]" in err
    assert "MODELFORGE_AGENT_STATE_VOLUME" in err
    assert str(identity_path(agent_env)) in err
    assert "a used token cannot enroll again" in err
    assert len(control_plane.requests) == 1
    assert not identity_path(agent_env).exists()


@pytest.mark.parametrize("code", ["ENROLLMENT_TOKEN_UNKNOWN", "ENROLLMENT_TOKEN_EXPIRED"])
def test_an_unknown_or_expired_token_exits_3(
    code: str,
    agent_env: dict[str, str],
    control_plane: RecordingControlPlane,
    capsys: pytest.CaptureFixture[str],
) -> None:
    control_plane.enroll_answers.append((401, error(code, "no")))

    assert run(agent_env) == 3

    assert f"modelforge-agent refused to start: [{code}]" in capsys.readouterr().err
    assert control_plane.heartbeats == []


def test_enrollment_retries_a_control_plane_that_is_down_then_enrolls(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent.heartbeat, "MIN_RETRY_DELAY_S", 0.01)
    monkeypatch.setattr(agent.heartbeat, "BACKOFF_CAP_S", 0.01)
    control_plane.enroll_answers += [(503, error("UNAVAILABLE", "starting")), (502, error("BAD_GATEWAY", ""))]

    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    assert len(control_plane.enrollments) == 3
    assert load_identity(identity_path(agent_env)) is not None


def test_a_corrupt_identity_file_is_refused_not_replaced_by_a_new_enrollment(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    path = identity_path(agent_env)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")

    assert run(agent_env) == 3

    assert "[IDENTITY_FILE_INVALID]" in capsys.readouterr().err
    assert control_plane.requests == []
    assert path.read_text() == "{not json"


def test_the_identity_file_is_replaced_atomically_from_a_synced_sibling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "identity.json"
    save_identity(path, an_identity(node_name="old"))
    replaced: list[tuple[str, str, str]] = []
    synced: list[int] = []
    real_replace, real_fsync = os.replace, os.fsync

    def spy_replace(source: str, target: str) -> None:
        # At the moment of the rename the old file is intact and the new one complete, beside it.
        replaced.append((source, json.loads(Path(source).read_text())["node_name"], path.read_text()))
        real_replace(source, target)

    def spy_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "replace", spy_replace)
    monkeypatch.setattr(os, "fsync", spy_fsync)

    save_identity(path, an_identity(node_name="new"))

    ((source, new_name, old_text),) = replaced
    assert Path(source).parent == tmp_path
    assert new_name == "new"
    assert json.loads(old_text)["node_name"] == "old"
    assert len(synced) == 2  # the file before the rename, the directory after it
    assert load_identity(path) == an_identity(node_name="new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["identity.json"]


def test_a_failed_write_leaves_no_identity_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)

    with pytest.raises(OSError, match="No space left"):
        save_identity(tmp_path / "identity.json", an_identity())

    assert list(tmp_path.iterdir()) == []


def test_the_credential_stays_out_of_reprs() -> None:
    assert "node-credential-secret" not in repr(an_identity())


def test_a_busy_port_is_refused_and_the_identity_kept_for_the_restart(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        agent_env["MODELFORGE_AGENT_PORT"] = str(busy.getsockname()[1])

        assert run(agent_env) == 3

    assert "[AGENT_PORT_UNAVAILABLE]" in capsys.readouterr().err
    assert load_identity(identity_path(agent_env)) is not None
    assert control_plane.heartbeats == []
