"""Start-up step 3: configured for NVIDIA, NVML must work before the agent says anything at all.

Seeds (Troubleshooting, Nodes): the agent "exits with code 3 before enrollment, heartbeat, inventory,
or telemetry publication". NVML is replaced only at the ``pynvml`` module boundary.
"""

from __future__ import annotations

import sys

import pytest

from agent.app import run
from tests.agent.fakes import GIB, FakeGpu, fake_pynvml
from tests.agent.support import RecordingControlPlane, run_agent


@pytest.fixture
def nvidia_env(agent_env: dict[str, str]) -> dict[str, str]:
    agent_env["MODELFORGE_AGENT_ACCELERATOR_MODE"] = "nvidia"
    return agent_env


FAILURES = [
    pytest.param(
        fake_pynvml(init_error="NVML Shared Library Not Found"), "NVIDIA_NVML_UNAVAILABLE", id="nvml"
    ),
    pytest.param(fake_pynvml(gpus=[]), "NVIDIA_DEVICE_NOT_FOUND", id="no-device"),
    pytest.param(
        fake_pynvml(gpus=[FakeGpu(), FakeGpu(failing_query="nvmlDeviceGetTemperature")]),
        "NVIDIA_TELEMETRY_UNAVAILABLE",
        id="telemetry",
    ),
]


@pytest.mark.parametrize(("nvml", "code"), FAILURES)
def test_an_nvidia_failure_exits_3_before_any_request(
    nvml: object,
    code: str,
    nvidia_env: dict[str, str],
    control_plane: RecordingControlPlane,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    status = run(nvidia_env)

    assert status == 3
    assert f"modelforge-agent refused to start: [{code}]" in capsys.readouterr().err
    assert control_plane.requests == []


def test_nvml_unavailable_says_what_to_check(
    nvidia_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error="Driver Not Loaded"))

    run(nvidia_env)

    err = capsys.readouterr().err
    for check in ("nvidia-smi", "NVIDIA Container Toolkit", "/dev/nvidia*", "libnvidia-ml.so.1"):
        assert check in err
    assert "Do not copy a driver library into the image" in err
    assert "Driver Not Loaded" in err


def test_a_missing_nvidia_ml_py_is_nvml_unavailable(
    nvidia_env: dict[str, str],
    control_plane: RecordingControlPlane,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes `import pynvml` raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None)

    assert run(nvidia_env) == 3

    assert "[NVIDIA_NVML_UNAVAILABLE]" in capsys.readouterr().err
    assert control_plane.requests == []


@pytest.mark.parametrize(("nvml", "code"), FAILURES)
def test_auto_with_nvidia_visible_devices_exits_like_nvidia(
    nvml: object,
    code: str,
    agent_env: dict[str, str],
    control_plane: RecordingControlPlane,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent_env |= {"MODELFORGE_AGENT_ACCELERATOR_MODE": "auto", "NVIDIA_VISIBLE_DEVICES": "all"}
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    assert run(agent_env) == 3

    assert f"[{code}]" in capsys.readouterr().err
    assert control_plane.requests == []


def test_auto_with_nvidia_visible_devices_publishes_as_nvidia(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_env |= {"MODELFORGE_AGENT_ACCELERATOR_MODE": "auto", "NVIDIA_VISIBLE_DEVICES": "0"}
    nvml = fake_pynvml(gpus=[FakeGpu(uuid="GPU-aaaa", used=2 * GIB, utilization=7, temperature=51)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    assert control_plane.enrollments[0].json()["accelerator"] == "nvidia"
    heartbeat = control_plane.heartbeats[0].json()
    assert heartbeat["accelerator"] == "nvidia"
    assert [gpu["uuid"] for gpu in heartbeat["gpus"]] == ["GPU-aaaa"]
    assert nvml.calls.shutdown == 1


@pytest.mark.parametrize("visible", [None, "", "void", "none"])
def test_auto_without_gpu_evidence_falls_back_to_cpu(
    visible: str | None,
    agent_env: dict[str, str],
    control_plane: RecordingControlPlane,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent_env["MODELFORGE_AGENT_ACCELERATOR_MODE"] = "auto"
    if visible is not None:
        agent_env["NVIDIA_VISIBLE_DEVICES"] = visible
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error="NVML Shared Library Not Found"))

    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    assert control_plane.enrollments[0].json()["accelerator"] == "cpu"
    heartbeat = control_plane.heartbeats[0].json()
    assert heartbeat["accelerator"] == "cpu"
    assert heartbeat["gpus"] == []


def test_auto_without_evidence_uses_gpus_that_nvml_lists(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_env["MODELFORGE_AGENT_ACCELERATOR_MODE"] = "auto"
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus=[FakeGpu()]))

    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    assert control_plane.heartbeats[0].json()["accelerator"] == "nvidia"


def test_cpu_mode_never_touches_nvml(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_env["NVIDIA_VISIBLE_DEVICES"] = "all"
    nvml = fake_pynvml(gpus=[FakeGpu()])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    assert nvml.calls.init == 0
    assert control_plane.heartbeats[0].json()["accelerator"] == "cpu"
