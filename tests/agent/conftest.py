"""Agent test fixtures: the recording control plane on 127.0.0.1 and a complete agent environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.support import (
    CLUSTER_SECRET,
    ENROLLMENT_TOKEN,
    RecordingControlPlane,
    free_port,
    recording_control_plane,
)


@pytest.fixture
def control_plane() -> Iterator[RecordingControlPlane]:
    with recording_control_plane() as recorder:
        yield recorder


@pytest.fixture
def agent_env(tmp_path: Path, control_plane: RecordingControlPlane) -> dict[str, str]:
    """A complete, valid agent environment in CPU mode, pointing at the recording control plane."""
    return {
        "HOME": str(tmp_path / "home"),
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": control_plane.url,
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": ENROLLMENT_TOKEN,
        "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
        "MODELFORGE_AGENT_CLUSTER_SECRET": CLUSTER_SECRET,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_LISTEN_HOST": "127.0.0.1",
        "MODELFORGE_AGENT_PORT": str(free_port()),
        "MODELFORGE_AGENT_HEARTBEAT_INTERVAL": "1",
        "MODELFORGE_AGENT_NAME": "test-node",
        "MODELFORGE_AGENT_ADVERTISE_HOST": "127.0.0.1",
    }
