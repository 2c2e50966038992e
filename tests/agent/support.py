"""Helpers for the agent tests: a control plane that records requests, waiting, in-process agent runs.

Nothing here needs the database or the real control plane: the agent only talks HTTP, so a small
stdlib server that answers the wire contract and records every request stands in for it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent.app import run

ENROLLMENT_TOKEN = "mf-enroll-test-token-0123456789"
CLUSTER_SECRET = "cluster-secret-for-the-agent-tests"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout: float = 10, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Answer = tuple[int, dict[str, Any]]


@dataclass
class RecordingControlPlane:
    """Answers enroll and heartbeat per the wire contract and records every request it receives."""

    url: str = ""
    node_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    credential: str = field(default_factory=lambda: "node-credential-" + uuid.uuid4().hex)
    requests: list[Recorded] = field(default_factory=list)
    # Queued answers; when empty, the contract's success answer.
    enroll_answers: list[Answer] = field(default_factory=list)
    heartbeat_answers: list[Answer] = field(default_factory=list)

    def paths(self, suffix: str) -> list[Recorded]:
        return [request for request in self.requests if request.path.endswith(suffix)]

    @property
    def enrollments(self) -> list[Recorded]:
        return self.paths("/api/v1/agent/enroll")

    @property
    def heartbeats(self) -> list[Recorded]:
        return self.paths("/api/v1/agent/heartbeat")

    def answer(self, request: Recorded) -> Answer:
        if request.path.endswith("/api/v1/agent/enroll"):
            if self.enroll_answers:
                return self.enroll_answers.pop(0)
            return 201, {
                "node_id": self.node_id,
                "node_name": request.json()["name"],
                "credential": self.credential,
                "heartbeat_interval_s": 1,
            }
        if request.path.endswith("/api/v1/agent/heartbeat"):
            if self.heartbeat_answers:
                return self.heartbeat_answers.pop(0)
            if request.headers.get("authorization") != f"Bearer {self.credential}":
                return 401, error("NODE_CREDENTIAL_INVALID", "unknown credential")
            return 200, {
                "node_id": self.node_id,
                "liveness": "online",
                "enabled": True,
                "heartbeat_interval_s": 1,
            }
        return 404, error("NOT_FOUND", "no such path")


def error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "correlation_id": uuid.uuid4().hex}


def run_agent(environ: dict[str, str], until: Callable[[], bool], timeout: float = 10) -> int:
    """Run the agent in-process until ``until()`` holds (or it exits by itself); its exit status."""
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(run(environ, stop)), daemon=True)
    thread.start()
    wait_until(lambda: until() or not thread.is_alive(), timeout)
    stop.set()
    thread.join(timeout)
    assert not thread.is_alive(), "the agent did not stop within the timeout"
    return result[0]


@contextmanager
def recording_control_plane() -> Iterator[RecordingControlPlane]:
    """A ``RecordingControlPlane`` listening on 127.0.0.1 for the duration of the block."""
    recorder = RecordingControlPlane()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            recorder.requests.append(request)
            status, payload = recorder.answer(request)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
