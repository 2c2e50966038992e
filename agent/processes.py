"""Model-server processes the agent launches, watches and stops on the control plane's request.

Their pids are the agent's *managed* pids: the GPU memory they use is reported as ModelForge's own,
everything else on the GPU as external pressure (observed, never touched).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("agent.processes")

STARTING, RUNNING, FAILED, STOPPED = "starting", "running", "failed", "stopped"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ManagedServer:
    """One launched model server and what the agent knows of it."""

    server_id: str
    process: subprocess.Popen[bytes]
    port: int
    health_path: str
    state: str = STARTING
    reason: str = ""
    model: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    output: deque[str] = field(default_factory=lambda: deque(maxlen=20))

    def as_payload(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "state": self.state,
            "pid": self.process.pid,
            "port": self.port,
            "reason": self.reason,
            "model": self.model,
            "meta": self.meta,
        }


class ProcessManager:
    """Launches servers from a rendered template, watches their health, stops them on request."""

    def __init__(self, models_dir: Path, start_timeout_s: float = 300) -> None:
        self.models_dir = models_dir
        self.start_timeout_s = start_timeout_s
        self._servers: dict[str, ManagedServer] = {}
        self._lock = threading.Lock()

    def pids(self) -> frozenset[int]:
        """Every process of every live server: each runs in its own process group, so an engine's
        workers (vLLM spawns several) count as managed too, not as external pressure."""
        with self._lock:
            groups = {s.process.pid for s in self._servers.values() if s.process.poll() is None}
        if not groups:
            return frozenset()
        members = set(groups)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) in groups:
                        members.add(int(entry))
                except OSError:
                    continue
        return frozenset(members)

    def all(self) -> list[ManagedServer]:
        with self._lock:
            return list(self._servers.values())

    def get(self, server_id: str) -> ManagedServer | None:
        with self._lock:
            return self._servers.get(server_id)

    def launch(self, spec: dict[str, Any]) -> ManagedServer:
        """Start ``spec`` (server_id, command, args, env, health_path, values) unless already running."""
        server_id = str(spec["server_id"])
        with self._lock:
            existing = self._servers.get(server_id)
            if existing is not None and existing.process.poll() is None:
                return existing  # idempotent: a retried launch does not start a second process
        port = free_port()
        values = {
            **{str(k): str(v) for k, v in (spec.get("values") or {}).items()},
            "python": sys.executable,
            "port": str(port),
            "model_path": str(self.models_dir / str(spec.get("model", ""))),
            "server_id": server_id,
        }

        def fill(text: str) -> str:
            for key, value in values.items():
                text = text.replace("{" + key + "}", value)
            return text

        argv = [fill(spec["command"]), *(fill(a) for a in spec.get("args", []))]
        env = {**os.environ, **{k: fill(v) for k, v in (spec.get("env") or {}).items()}}
        process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        managed = ManagedServer(
            server_id,
            process,
            port,
            str(spec.get("health_path") or "/health"),
            model=str(spec.get("model", "")),
            meta=dict(spec.get("meta") or {}),
        )
        with self._lock:
            self._servers[server_id] = managed
        threading.Thread(target=self._drain, args=(managed,), daemon=True).start()
        threading.Thread(target=self._watch, args=(managed,), daemon=True).start()
        logger.info("launched server %s as pid %s on port %s", server_id, process.pid, port)
        return managed

    def stop(self, server_id: str, grace_s: float = 10) -> ManagedServer | None:
        managed = self.get(server_id)
        if managed is None:
            return None
        if managed.process.poll() is None:
            managed.state = STOPPED
            managed.reason = "stopped on request"
            os.killpg(managed.process.pid, signal.SIGTERM)
            try:
                managed.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(managed.process.pid, signal.SIGKILL)
                managed.process.wait()
        elif managed.state not in (FAILED, STOPPED):
            managed.state = STOPPED
        return managed

    def stop_all(self) -> None:
        for server_id in list(self._servers):
            self.stop(server_id, grace_s=5)

    def _drain(self, managed: ManagedServer) -> None:
        assert managed.process.stdout is not None
        for raw in managed.process.stdout:
            managed.output.append(raw.decode(errors="replace").rstrip())

    def _watch(self, managed: ManagedServer) -> None:
        url = f"http://127.0.0.1:{managed.port}{managed.health_path}"
        deadline = time.monotonic() + self.start_timeout_s
        while managed.state == STARTING:
            code = managed.process.poll()
            if code is not None:
                managed.state = FAILED
                tail = " | ".join(list(managed.output)[-3:])
                managed.reason = f"exited with status {code} before it was healthy" + (
                    f": {tail}" if tail else ""
                )
                return
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        managed.state = RUNNING
                        logger.info("server %s is healthy on port %s", managed.server_id, managed.port)
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                managed.state = FAILED
                managed.reason = f"not healthy at {managed.health_path} within {self.start_timeout_s:.0f} s"
                os.killpg(managed.process.pid, signal.SIGTERM)
                return
            time.sleep(0.3)
        code = managed.process.wait()
        if managed.state == RUNNING:
            managed.state = FAILED
            managed.reason = f"exited with status {code} while running"
