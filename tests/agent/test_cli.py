"""The agent as operators run it: ``python -m agent`` and ``modelforge-agent``, stopped by a signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from agent.protocol import signed_headers
from tests.agent.support import CLUSTER_SECRET, RecordingControlPlane, wait_until

ROOT = Path(__file__).resolve().parents[2]


def child_env(agent_env: dict[str, str]) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1"} | agent_env


def test_python_m_agent_enrolls_serves_signed_calls_and_stops_cleanly_on_sigterm(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, tmp_path: Path
) -> None:
    log_path = tmp_path / "agent.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agent"], cwd=ROOT, env=child_env(agent_env), stdout=log, stderr=log
        )
    try:
        assert wait_until(lambda: bool(control_plane.heartbeats), 15), log_path.read_text()
        port = agent_env["MODELFORGE_AGENT_PORT"]
        response = httpx.get(
            f"http://127.0.0.1:{port}/v1/ping", headers=signed_headers(CLUSTER_SECRET, "GET", "/v1/ping")
        )
        assert response.status_code == 200
        assert response.json()["node_id"] == control_plane.node_id

        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log_text = log_path.read_text()
    assert "first heartbeat accepted" in log_text
    assert control_plane.credential not in log_text
    assert json.loads((tmp_path / "state" / "identity.json").read_text())["node_id"] == control_plane.node_id


def test_the_console_script_refuses_a_bad_configuration_with_exit_3(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "modelforge-agent"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    env["MODELFORGE_AGENT_CONTROL_PLANE_URL"] = "https://modelforge.example.com"

    done = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)

    assert done.returncode == 3
    assert done.stderr.splitlines()[0] == (
        "modelforge-agent refused to start: 3 configuration problem(s) must be resolved."
    )
    assert "[PLACEHOLDER_CONTROL_PLANE_URL] MODELFORGE_AGENT_CONTROL_PLANE_URL" in done.stderr
