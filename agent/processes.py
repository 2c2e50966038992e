"""Model-server processes the agent launches, watches and stops on the control plane's request.

Their pids are the agent's *managed* pids: the GPU memory they use is reported as ModelForge's own,
everything else on the GPU as external pressure (observed, never touched).
"""

from __future__ import annotations

import json
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
# In the state volume: the servers this agent runs, so that a run after a crash adopts them.
SERVERS_FILE_NAME = "servers.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat, field 22): with the pid, it
    names one process for good (a pid alone may be reused after a reboot or a long uptime)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if fields[0] == "Z":
        return None  # exited; only its parent has not collected it yet
    return int(fields[19])


class AdoptedProcess:
    """A model server a previous run of this agent started, still running after that run crashed: not
    our child, so watched through /proc, and stopped through its process group like any other."""

    def __init__(self, pid: int, ticks: int) -> None:
        self.pid = pid
        self.ticks = ticks
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and start_ticks(self.pid) != self.ticks:
            self.returncode = -1  # gone (its exit status went to its real parent)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.2)
        assert self.returncode is not None
        return self.returncode


READY_CHECKS: dict[str, tuple[str, dict[str, Any], str]] = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1, "temperature": 0},
        "choices",
    ),
    "embeddings": ("/v1/embeddings", {"input": "ready"}, "data"),
}


def ready_check(managed: ManagedServer) -> str:
    """'' when the server answers one real inference of its kind; otherwise what went wrong."""
    check = READY_CHECKS.get(managed.ready_check)
    if check is None:
        return ""
    path, body, key = check
    request = urllib.request.Request(
        f"http://127.0.0.1:{managed.port}{path}",
        data=json.dumps({"model": managed.model, **body}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 -- our loopback
            answer = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return f"a one-token {managed.ready_check} request answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"a one-token {managed.ready_check} request failed ({type(exc).__name__})"
    if not isinstance(answer, dict) or not answer.get(key):
        return f"a one-token {managed.ready_check} request answered without {key!r}"
    return ""


@dataclass
class ManagedServer:
    """One launched model server and what the agent knows of it."""

    server_id: str
    process: subprocess.Popen[bytes] | AdoptedProcess
    port: int
    health_path: str
    state: str = STARTING
    ready_check: str = "none"
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

    def __init__(
        self, models_dir: Path, start_timeout_s: float = 300, state_file: Path | None = None
    ) -> None:
        self.models_dir = models_dir
        self.start_timeout_s = start_timeout_s
        self.state_file = state_file
        self._servers: dict[str, ManagedServer] = {}
        self._lock = threading.Lock()

    # --- surviving a crash of the agent itself --------------------------------------------------------
    # Servers run in sessions of their own, so an agent killed with SIGKILL leaves them running. Their
    # pids (with start times) are kept in the state volume; the next run adopts the ones still alive, so
    # it reports them and the control plane neither loses nor duplicates them. A clean stop of the agent
    # stops its servers and leaves an empty list.

    def _save(self) -> None:
        if self.state_file is None:
            return
        with self._lock:
            entries = [
                {
                    "server_id": m.server_id,
                    "pid": m.process.pid,
                    "ticks": m.process.ticks
                    if isinstance(m.process, AdoptedProcess)
                    else start_ticks(m.process.pid),
                    "port": m.port,
                    "health_path": m.health_path,
                    "model": m.model,
                    "meta": m.meta,
                }
                for m in self._servers.values()
                if m.process.poll() is None
            ]
        temporary = self.state_file.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(entries))
            os.replace(temporary, self.state_file)
        except OSError as exc:
            logger.warning("could not record the running servers in %s: %s", self.state_file, exc)

    def adopt(self) -> list[str]:
        """Take over the servers a crashed previous run left running; returns their ids."""
        if self.state_file is None:
            return []
        try:
            entries = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return []
        adopted = []
        for entry in entries if isinstance(entries, list) else []:
            try:
                pid, ticks, server_id = int(entry["pid"]), int(entry["ticks"]), str(entry["server_id"])
            except (KeyError, TypeError, ValueError):
                continue
            if start_ticks(pid) != ticks:
                continue  # it ended meanwhile, or the pid is another process now
            managed = ManagedServer(
                server_id,
                AdoptedProcess(pid, ticks),
                int(entry.get("port") or 0),
                str(entry.get("health_path") or "/health"),
                model=str(entry.get("model") or ""),
                meta=dict(entry.get("meta") or {}),
            )
            with self._lock:
                self._servers[server_id] = managed
            threading.Thread(target=self._watch, args=(managed,), daemon=True).start()
            adopted.append(server_id)
            logger.warning(
                "adopted server %s (pid %s on port %s), left running by a previous run",
                server_id,
                pid,
                managed.port,
            )
        self._save()
        return adopted

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
            ready_check=str(spec.get("ready_check") or "none"),
            model=str(spec.get("model", "")),
            meta=dict(spec.get("meta") or {}),
        )
        with self._lock:
            self._servers[server_id] = managed
        threading.Thread(target=self._drain, args=(managed,), daemon=True).start()
        threading.Thread(target=self._watch, args=(managed,), daemon=True).start()
        self._save()
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
        self._save()
        return managed

    def stop_all(self) -> None:
        for server_id in list(self._servers):
            self.stop(server_id, grace_s=5)

    def _drain(self, managed: ManagedServer) -> None:
        assert isinstance(managed.process, subprocess.Popen) and managed.process.stdout is not None
        for raw in managed.process.stdout:
            managed.output.append(raw.decode(errors="replace").rstrip())

    def _watch(self, managed: ManagedServer) -> None:
        url = f"http://127.0.0.1:{managed.port}{managed.health_path}"
        deadline = time.monotonic() + self.start_timeout_s
        healthy = False
        not_ready = ""
        while managed.state == STARTING:
            code = managed.process.poll()
            if code is not None:
                managed.state = FAILED
                tail = " | ".join(list(managed.output)[-3:])
                stage = "ready (its first inference)" if healthy else "healthy"
                managed.reason = f"exited with status {code} before it was {stage}" + (
                    f": {tail}" if tail else ""
                )
                return
            try:
                if not healthy:
                    with urllib.request.urlopen(url, timeout=2) as response:
                        healthy = response.status == 200
                if healthy:
                    # Health answers before the model has run once: a one-token inference proves it
                    # (an engine that dies on its first inference never reports running).
                    not_ready = ready_check(managed)
                    if not not_ready:
                        managed.state = RUNNING
                        logger.info("server %s is ready on port %s", managed.server_id, managed.port)
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                managed.state = FAILED
                managed.reason = (
                    f"healthy, but {not_ready} within {self.start_timeout_s:.0f} s"
                    if healthy
                    else f"not healthy at {managed.health_path} within {self.start_timeout_s:.0f} s"
                )
                os.killpg(managed.process.pid, signal.SIGTERM)
                return
            time.sleep(0.3)
        code = managed.process.wait()
        if managed.state == RUNNING:
            managed.state = FAILED
            managed.reason = f"exited with status {code} while running"
