"""Heartbeats: failures logged with status, method and path only; full-jitter back-off; recovery.

Seeds (Nodes): "A failed publication names the status, method and path — never the response body and
never the credential."
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from agent.client import ControlPlaneClient
from agent.heartbeat import BACKOFF_CAP_S, HEARTBEAT_BACKOFF_INTERVALS, HeartbeatLoop, backoff_delay
from tests.agent.support import RecordingControlPlane, error, free_port, run_agent

BODY_MARKER = "body-marker-do-not-log-7f3a"


def loop_for(url: str, credential: str, rng: Any = lambda: 0.5) -> HeartbeatLoop:
    payload = {"agent_version": "0.1.0", "accelerator": "cpu", "gpus": []}
    return HeartbeatLoop(ControlPlaneClient(url), credential, lambda: payload, 10, threading.Event(), rng=rng)


@pytest.mark.parametrize(
    ("status", "code"),
    [(401, "NODE_CREDENTIAL_INVALID"), (500, "INTERNAL"), (503, "UNAVAILABLE"), (400, "BAD")],
)
def test_a_failed_publication_logs_status_method_and_path_only(
    status: int, code: str, control_plane: RecordingControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    control_plane.heartbeat_answers.append((status, error(code, BODY_MARKER)))

    loop_for(control_plane.url, control_plane.credential).beat()

    assert f"heartbeat publication failed: {status} POST /api/v1/agent/heartbeat" in caplog.text
    assert BODY_MARKER not in caplog.text
    assert control_plane.credential not in caplog.text


def test_a_refused_credential_is_named_and_retried(
    control_plane: RecordingControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    loop = loop_for(control_plane.url, "a-credential-the-control-plane-never-issued")

    delays = [loop.beat() for _ in range(3)]

    assert caplog.text.count("[NODE_CREDENTIAL_INVALID]") == 1
    assert "a-credential-the-control-plane-never-issued" not in caplog.text
    assert loop.failures == 3
    # Full jitter (0.5 drawn here) under a ceiling that doubles up to three intervals (30 s).
    assert delays == [10 * 2 * 0.5, 30 * 0.5, 30 * 0.5]


def test_an_unreachable_control_plane_is_logged_without_the_url_details(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = loop_for(f"http://127.0.0.1:{free_port()}", "credential-not-to-log")

    loop.beat()

    assert (
        "heartbeat publication failed: no response (ConnectError) POST /api/v1/agent/heartbeat" in caplog.text
    )
    assert "credential-not-to-log" not in caplog.text


def test_success_returns_to_the_control_planes_interval_and_logs_the_first_one(
    control_plane: RecordingControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent")
    control_plane.heartbeat_answers += [
        (503, error("UNAVAILABLE", "")),
        (200, {"node_id": "n", "liveness": "online", "enabled": True, "heartbeat_interval_s": 15}),
        (200, {"node_id": "n", "liveness": "online", "enabled": True, "heartbeat_interval_s": 15}),
    ]
    loop = loop_for(control_plane.url, control_plane.credential)

    loop.beat()
    assert loop.beat() == 15.0
    assert loop.beat() == 15.0

    assert loop.failures == 0
    first = [
        r for r in caplog.records if r.levelno == logging.INFO and "first heartbeat accepted" in r.message
    ]
    assert len(first) == 1


def test_back_off_is_full_jitter_capped_at_five_minutes() -> None:
    assert backoff_delay(10, 1, rng=lambda: 1.0) == 20
    assert backoff_delay(10, 3, rng=lambda: 1.0) == 80
    assert backoff_delay(10, 50, rng=lambda: 1.0) == BACKOFF_CAP_S == 300
    assert backoff_delay(10, 3, rng=lambda: 0.25) == 20
    # Full jitter may draw zero; the floor keeps a broken control plane from being hammered.
    assert backoff_delay(10, 3, rng=lambda: 0.0) == 1.0


def test_heartbeats_back_off_to_at_most_three_intervals_so_a_returning_control_plane_hears_them() -> None:
    loop = HeartbeatLoop(None, "cred", dict, interval_s=10, stop=threading.Event(), rng=lambda: 1.0)  # type: ignore[arg-type]
    delays = [loop._failed() for _ in range(12)]
    assert delays[:2] == [20, 30]
    assert max(delays) == 30 == HEARTBEAT_BACKOFF_INTERVALS * 10


def test_a_control_plane_behind_a_path_prefix_is_called_under_it(
    agent_env: dict[str, str], control_plane: RecordingControlPlane
) -> None:
    agent_env["MODELFORGE_AGENT_CONTROL_PLANE_URL"] = control_plane.url + "/modelforge/"

    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    assert [r.path for r in control_plane.requests[:2]] == [
        "/modelforge/api/v1/agent/enroll",
        "/modelforge/api/v1/agent/heartbeat",
    ]


def test_a_running_agent_never_logs_its_token_or_credential(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    control_plane.heartbeat_answers.append((401, error("NODE_CREDENTIAL_INVALID", BODY_MARKER)))

    run_agent(agent_env, until=lambda: bool(control_plane.heartbeats))

    assert "heartbeat publication failed: 401 POST /api/v1/agent/heartbeat" in caplog.text
    for secret in (control_plane.credential, agent_env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"], BODY_MARKER):
        assert secret not in caplog.text
