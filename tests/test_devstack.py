"""`make run`'s machinery: embedded PostgreSQL 16 and Redis, migrate, the operator login, web + worker +
beat, and a clean stop on Ctrl-C — run for real in a throw-away data folder on free ports."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest

from tests.fixtures import PYTHON, free_port, http_ok, process_env, start_process, wait_until

pytestmark = pytest.mark.stack


def test_the_embedded_platform_starts_serves_and_stops_cleanly(tmp_path):
    home = tmp_path / "home"
    web_port, pg_port, redis_port = free_port(), free_port(), free_port()
    env = process_env(
        MODELFORGE_HOME=str(home),
        MODELFORGE_PORT=str(web_port),
        MODELFORGE_EMBEDDED_PG_PORT=str(pg_port),
        MODELFORGE_EMBEDDED_REDIS_PORT=str(redis_port),
        MODELFORGE_DATABASE_URL=None,
        MODELFORGE_REDIS_URL=None,
        MODELFORGE_SECRET_KEY=None,
        MODELFORGE_OPERATOR_API_KEY=None,
        MODELFORGE_CLUSTER_SECRET=None,
        MODELFORGE_WEB_WORKERS="1",
        MODELFORGE_WORKER_CONCURRENCY="1",
        MODELFORGE_AGENT_PORT=str(free_port()),
    )
    running = start_process([PYTHON, "-m", "modelforge.devstack", "run"], env, tmp_path / "run.log")
    base = f"http://127.0.0.1:{web_port}"
    try:
        assert wait_until(lambda: "ModelForge is running at" in running.log(), 180), running.log()[-4000:]
        assert "Created the operator login: username 'operator'" in running.log()
        login = (home / "secrets" / "operator-login").read_text()
        assert login.startswith("username=operator\npassword=")
        assert oct((home / "secrets" / "operator-login").stat().st_mode & 0o777) == "0o600"
        assert http_ok(base + "/readyz")

        key = (home / "secrets" / "operator-api-key").read_text().strip()
        request = urllib.request.Request(
            base + "/api/v1/system/status", headers={"Authorization": f"Bearer {key}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            status = json.loads(response.read())
        assert status["database"]["detail"].startswith("PostgreSQL 16")

        # Beat's probe (or the worker's first task) reaches the worker: the whole loop runs.
        probe = urllib.request.Request(
            base + "/api/v1/system/worker-probe", method="POST", headers={"Authorization": f"Bearer {key}"}
        )
        urllib.request.urlopen(probe, timeout=5).close()

        def worker_seen() -> bool:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())["worker_seen_at"] is not None

        assert wait_until(worker_seen, 60, interval=1), running.log()[-4000:]

        # The local node's agent enrolled and reports: one real node online with real figures.
        nodes_request = urllib.request.Request(
            base + "/api/v1/nodes?liveness=online", headers={"Authorization": f"Bearer {key}"}
        )

        def local_node_online() -> bool:
            with urllib.request.urlopen(nodes_request, timeout=5) as response:
                return json.loads(response.read())["count"] == 1

        assert wait_until(local_node_online, 60, interval=1), running.log()[-4000:]
        with urllib.request.urlopen(nodes_request, timeout=5) as response:
            local = json.loads(response.read())["results"][0]
        assert local["memory_total_bytes"] > 0 and local["assignable"] is True

        # A model server can be started at once: the test-echo profile on the demo model of the local node.
        place = urllib.request.Request(
            base + "/api/v1/servers",
            method="POST",
            data=json.dumps({"name": "demo", "profile": "test-echo", "model": "echo-demo"}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(place, timeout=10) as response:
            server = json.loads(response.read())
        assert server["node_name"] == local["name"]
        server_request = urllib.request.Request(
            base + f"/api/v1/servers/{server['id']}", headers={"Authorization": f"Bearer {key}"}
        )

        def demo_running() -> bool:
            with urllib.request.urlopen(server_request, timeout=5) as response:
                return json.loads(response.read())["state"] == "running"

        assert wait_until(demo_running, 60, interval=1), running.log()[-4000:]
    finally:
        code = interrupt(running)
    assert_stopped_cleanly(code, running.log(), home, base)

    # A second run reuses the data: same database, no second operator login.
    again = start_process([PYTHON, "-m", "modelforge.devstack", "run"], env, tmp_path / "run-again.log")
    try:
        assert wait_until(lambda: "ModelForge is running at" in again.log(), 120), again.log()[-4000:]
        assert "An operator login already exists" in again.log()
        assert "Applying" not in again.log()

        # The local agent came back with its kept identity: still exactly one node, the same one.
        def same_single_node() -> bool:
            request = urllib.request.Request(
                base + "/api/v1/nodes", headers={"Authorization": f"Bearer {key}"}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                body = json.loads(response.read())
            return (
                body["count"] == 1
                and body["results"][0]["id"] == local["id"]
                and body["results"][0]["liveness"] == "online"
            )

        assert wait_until(same_single_node, 60, interval=1), again.log()[-4000:]
        assert (home / "secrets" / "operator-login").read_text() == login
    finally:
        code = interrupt(again)
    assert_stopped_cleanly(code, again.log(), home, base)


def interrupt(running) -> int:
    """Ctrl-C, as a terminal would send it to the foreground process."""
    if running.process.poll() is None:
        os.killpg(running.process.pid, signal.SIGINT)
    return running.process.wait(60)


def assert_stopped_cleanly(code: int, log: str, home, base: str) -> None:
    assert code == 0, log[-3000:]
    assert "modelforge: stopped" in log
    assert not (home / "postgres" / "data" / "postmaster.pid").exists()
    assert not (home / "redis" / "redis.pid").exists()
    assert not http_ok(base + "/healthz")
