"""The agent's listening port: the calls the control plane makes to this node.

Every request must be signed with the cluster secret (``agent.protocol``); the signature is checked
before routing, so an unsigned caller learns nothing, not even which paths exist. Error bodies are the
project's envelope, exactly ``{"code", "message", "correlation_id"}``; a 500 is the body
``Internal Server Error`` and the story goes to the log under the correlation id.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent import __version__
from agent.models import InvalidModelName, check_presence
from agent.processes import ProcessManager
from agent.protocol import CORRELATION_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from agent.replicas import ReplicaManager, verification

logger = logging.getLogger("agent.server")

VALIDATION_ERROR = "VALIDATION_ERROR"
NOT_FOUND = "NOT_FOUND"
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
# A replica's file whose record has no digest this agent can verify: refused, never copied unverified.
REPLICA_DIGEST_MISSING = "REPLICA_DIGEST_MISSING"
REPLICA_SHAPE = '{"replica_id", "name", "base_url", "files": [{"path", "size", "sha256", "blake3"?}]}'
MAX_BODY_BYTES = 1024 * 1024

# What a caller may send as X-Correlation-ID (the control plane's rule): short, printable, no spaces.
WELL_FORMED_CORRELATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{7,127}$")


@dataclass(frozen=True)
class AgentContext:
    """What the request handlers need: the secret to check, who this node is, where models live."""

    cluster_secret: str
    node_id: str
    node_name: str
    models_dir: Path
    processes: ProcessManager | None = None
    replicas: ReplicaManager | None = None


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def accept_or_generate(header_value: str | None) -> str:
    if header_value and WELL_FORMED_CORRELATION_ID.match(header_value):
        return header_value
    return uuid.uuid4().hex


def ping(context: AgentContext, body: bytes) -> dict[str, Any]:
    return {"node_id": context.node_id, "node_name": context.node_name, "agent_version": __version__}


def presence(context: AgentContext, body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise ApiError(400, VALIDATION_ERROR, 'the body must be JSON: {"model": "<name>"}') from None
    if not isinstance(data, dict) or "model" not in data:
        raise ApiError(400, VALIDATION_ERROR, 'the body must be a JSON object: {"model": "<name>"}')
    try:
        return check_presence(context.models_dir, data["model"]).as_payload()
    except InvalidModelName as exc:
        raise ApiError(400, VALIDATION_ERROR, str(exc)) from None


def _json_object(body: bytes, shape: str) -> dict[str, Any]:
    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise ApiError(400, VALIDATION_ERROR, f"the body must be JSON: {shape}") from None
    if not isinstance(data, dict):
        raise ApiError(400, VALIDATION_ERROR, f"the body must be a JSON object: {shape}")
    return data


def _manager(context: AgentContext) -> ProcessManager:
    if context.processes is None:
        raise ApiError(404, NOT_FOUND, "this agent does not run model servers")
    return context.processes


LAUNCH_SHAPE = (
    '{"server_id", "model", "command", "args": [...], "env": {...}, "health_path", "values": {...}, '
    '"meta": {...}}'
)
# What the control plane recorded of the server (name, profile, GPUs ...), kept and echoed back in the
# listing, so that books restored from an older backup can re-record what runs here. Bounded.
MAX_META_BYTES = 4096


def launch_server(context: AgentContext, body: bytes) -> dict[str, Any]:
    """Launch a model server from the control plane's template (placeholders filled here)."""
    spec = _json_object(body, LAUNCH_SHAPE)
    for key, kind in (
        ("server_id", str),
        ("model", str),
        ("command", str),
        ("args", list),
        ("health_path", str),
    ):
        if not isinstance(spec.get(key), kind):
            raise ApiError(400, VALIDATION_ERROR, f"{key} must be a {kind.__name__}: {LAUNCH_SHAPE}")
    meta = spec.get("meta", {})
    if not isinstance(meta, dict) or len(json.dumps(meta)) > MAX_META_BYTES:
        raise ApiError(400, VALIDATION_ERROR, f"meta must be an object of at most {MAX_META_BYTES} bytes")
    presence_of = check_presence(context.models_dir, spec["model"])
    if not presence_of.present:
        raise ApiError(409, "model_not_present_on_node", "Replicate the model to that node first.")
    try:
        return _manager(context).launch(spec).as_payload()
    except OSError as exc:
        raise ApiError(409, "LAUNCH_FAILED", f"cannot start {spec['command']!r}: {exc.strerror}") from None


def start_replica(context: AgentContext, body: bytes) -> dict[str, Any]:
    """Fetch an artifact from the control plane's store into the models directory (verified first)."""
    spec = _json_object(body, REPLICA_SHAPE)
    name = spec.get("name")
    if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or ".." in name:
        raise ApiError(400, VALIDATION_ERROR, "name must be one entry of the models directory")
    if not isinstance(spec.get("files"), list) or not isinstance(spec.get("base_url"), str):
        raise ApiError(400, VALIDATION_ERROR, "files (a list) and base_url are required")
    for item in spec["files"]:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("path"), str)
            or not isinstance(item.get("size"), int)
        ):
            raise ApiError(400, VALIDATION_ERROR, f"each file is an object: {REPLICA_SHAPE}")
        if verification(item) is None:
            raise ApiError(
                400,
                REPLICA_DIGEST_MISSING,
                f"{item['path']}: the record has no digest this agent can verify (a 64-hex sha256, or "
                "blake3 with the blake3 package installed); nothing is copied unverified",
            )
    if context.replicas is None:
        raise ApiError(404, NOT_FOUND, "this agent does not take replicas")
    return context.replicas.start(spec).as_payload()


def replica_status(context: AgentContext, body: bytes) -> dict[str, Any]:
    replica_id = str(_json_object(body, '{"replica_id"}').get("replica_id"))
    replica = context.replicas.get(replica_id) if context.replicas else None
    if replica is None:
        raise ApiError(404, NOT_FOUND, f"this agent has no replica {replica_id}")
    return replica.as_payload()


def list_servers(context: AgentContext, body: bytes) -> dict[str, Any]:
    """Every server this agent launched since it started, so the control plane can reconcile its books."""
    return {"servers": [managed.as_payload() for managed in _manager(context).all()]}


def server_status(context: AgentContext, body: bytes) -> dict[str, Any]:
    server_id = str(_json_object(body, '{"server_id"}').get("server_id"))
    managed = _manager(context).get(server_id)
    if managed is None:
        raise ApiError(404, NOT_FOUND, f"this agent runs no server {server_id}")
    return managed.as_payload()


def stop_server(context: AgentContext, body: bytes) -> dict[str, Any]:
    server_id = str(_json_object(body, '{"server_id"}').get("server_id"))
    managed = _manager(context).stop(server_id)
    if managed is None:
        raise ApiError(404, NOT_FOUND, f"this agent runs no server {server_id}")
    return managed.as_payload()


Handler = Callable[[AgentContext, bytes], dict[str, Any]]
ROUTES: dict[str, dict[str, Handler]] = {
    "/v1/ping": {"GET": ping},
    "/v1/presence": {"POST": presence},
    "/v1/servers": {"POST": launch_server, "GET": list_servers},
    "/v1/servers/status": {"POST": server_status},
    "/v1/servers/stop": {"POST": stop_server},
    "/v1/replicas": {"POST": start_replica},
    "/v1/replicas/status": {"POST": replica_status},
}


class AgentRequestHandler(BaseHTTPRequestHandler):
    server: AgentServer
    server_version = f"modelforge-agent/{__version__}"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30  # a silent client must not hold a thread forever

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        correlation_id = accept_or_generate(self.headers.get(CORRELATION_HEADER))
        try:
            body = self._read_body()
            status, payload = self._dispatch(body)
            self._send_json(status, payload, correlation_id)
        except ApiError as exc:
            envelope = {"code": exc.code, "message": exc.message, "correlation_id": correlation_id}
            self._send_json(exc.status, envelope, correlation_id, exc.headers)
        except Exception:
            logger.exception("agent request %s %s failed [%s]", self.command, self.path, correlation_id)
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8", correlation_id)

    def _read_body(self) -> bytes:
        length_header = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(400, VALIDATION_ERROR, "send the body with a Content-Length, not chunked")
        if not length_header:
            return b""
        if not length_header.strip().isdigit():
            self.close_connection = True
            raise ApiError(400, VALIDATION_ERROR, "Content-Length is not a number")
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(400, VALIDATION_ERROR, f"the body is larger than {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length)

    def _dispatch(self, body: bytes) -> tuple[int, dict[str, Any]]:
        context = self.server.context
        refusal = verify(
            context.cluster_secret,
            self.headers.get(TIMESTAMP_HEADER),
            self.headers.get(SIGNATURE_HEADER),
            self.command,
            self.path,
            body,
            now=self.server.clock(),
        )
        if refusal is not None:
            logger.warning(
                "refused %s %s from %s: %s", self.command, self.path, self.client_address[0], refusal.code
            )
            raise ApiError(401, refusal.code, refusal.message)
        route = ROUTES.get(self.path.split("?", 1)[0])
        if route is None:
            raise ApiError(404, NOT_FOUND, f"this agent has no {self.path.split('?', 1)[0]}")
        handler = route.get(self.command)
        if handler is None:
            allowed = ", ".join(sorted(route))
            raise ApiError(405, METHOD_NOT_ALLOWED, f"use {allowed} on this path", headers={"Allow": allowed})
        return 200, handler(context, body)

    def _send_json(
        self,
        status: int,
        payload: dict[str, Any],
        correlation_id: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", correlation_id, headers)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        correlation_id: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header(CORRELATION_HEADER, correlation_id)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # The request line and status only: headers carry the signature.
        logger.debug("%s %s", self.client_address[0], format % args)


class AgentServer(ThreadingHTTPServer):
    """The agent's HTTP server; one thread per request, none outliving the process."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], context: AgentContext, clock: Callable[[], float] | None = None
    ) -> None:
        self.context = context
        self.clock = clock or time.time
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, AgentRequestHandler)
