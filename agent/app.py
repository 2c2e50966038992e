"""The agent's life: start-up in a fixed order, then serve and publish until told to stop.

``run`` reads only the environment mapping it is given and stops when ``stop`` is set, so tests run
it in-process; ``agent.__main__`` adds logging and signal handling around it.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from agent import __version__
from agent.accelerator import Accelerator, AcceleratorRefusal, detect_accelerator
from agent.client import (
    ENROLLMENT_TOKEN_EXPIRED,
    ENROLLMENT_TOKEN_REVOKED,
    ENROLLMENT_TOKEN_UNKNOWN,
    ENROLLMENT_TOKEN_USED,
    NODE_NAME_TAKEN,
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneRefused,
)
from agent.engine_signals import EngineSignalReader
from agent.heartbeat import HeartbeatLoop, backoff_delay, heartbeat_payload
from agent.home import AGENT_HOME_NOT_WRITABLE, check_writable
from agent.identity import IDENTITY_FILE_INVALID, Identity, IdentityFileInvalid, load_identity, save_identity
from agent.processes import SERVERS_FILE_NAME, ProcessManager
from agent.replicas import ReplicaManager
from agent.server import AgentContext, AgentServer
from agent.settings import (
    CONTROL_PLANE_URL,
    ENROLLMENT_TOKEN,
    STATE_VOLUME,
    AgentSettings,
    load_settings,
    refusal_text,
)

logger = logging.getLogger("agent")

EXIT_OK = 0
EXIT_REFUSED = 3

ENROLLMENT_REFUSED = "ENROLLMENT_REFUSED"
AGENT_PORT_UNAVAILABLE = "AGENT_PORT_UNAVAILABLE"


class StartRefused(Exception):
    """One named reason the agent will not start; rendered on stderr, exit status 3."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message

    def text(self) -> str:
        return f"modelforge-agent refused to start: [{self.code}] {self.message}"


def _refuse(text: str) -> int:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    return EXIT_REFUSED


def _enrollment_refusal(settings: AgentSettings, exc: ControlPlaneRefused) -> StartRefused:
    if exc.code == ENROLLMENT_TOKEN_USED:
        return StartRefused(
            ENROLLMENT_TOKEN_USED,
            f"the enrollment token was already used, and a used token cannot enroll again. This node "
            f"has no identity: {settings.identity_path} is missing from {STATE_VOLUME} "
            f"({settings.state_volume}). If this node enrolled before, its state volume is not durable "
            "(the container's own filesystem, or a volume that was recreated): mount a persistent volume "
            "there. To bring the node back, remove its old record in the control plane and mint a new "
            f"enrollment token for {ENROLLMENT_TOKEN}.",
        )
    if exc.code == ENROLLMENT_TOKEN_EXPIRED:
        return StartRefused(
            ENROLLMENT_TOKEN_EXPIRED,
            "the enrollment token has expired; mint a new one in the control plane and set "
            f"{ENROLLMENT_TOKEN}",
        )
    if exc.code == ENROLLMENT_TOKEN_UNKNOWN:
        return StartRefused(
            ENROLLMENT_TOKEN_UNKNOWN,
            f"the control plane does not know this enrollment token; check that {ENROLLMENT_TOKEN} was "
            f"copied whole and that {CONTROL_PLANE_URL} points at the control plane that minted it",
        )
    if exc.code == ENROLLMENT_TOKEN_REVOKED:
        return StartRefused(
            ENROLLMENT_TOKEN_REVOKED,
            "the enrollment token was revoked in the control plane; mint a new one and set "
            f"{ENROLLMENT_TOKEN}",
        )
    if exc.code == NODE_NAME_TAKEN:
        return StartRefused(
            NODE_NAME_TAKEN,
            f"a node named {settings.name!r} is already enrolled. If it is this machine, its identity file "
            f"was lost from {STATE_VOLUME} ({settings.state_volume}): restore it, or delete the old node in "
            "the control plane first; otherwise set MODELFORGE_AGENT_NAME to another name. The token is "
            "still usable.",
        )
    return StartRefused(
        ENROLLMENT_REFUSED,
        f"the control plane refused enrollment: {exc.status} {exc.method} {exc.path}; check that "
        f"{CONTROL_PLANE_URL} points at a ModelForge control plane of a matching release",
    )


def enroll(
    settings: AgentSettings,
    accelerator: Accelerator,
    client: ControlPlaneClient,
    stop: threading.Event,
    rng: Callable[[], float] = random.random,
) -> Identity | None:
    """Trade the enrollment token for an identity and persist it; ``None`` if stopped meanwhile.

    Connection errors, 5xx and 429 are retried with back-off (the token is not spent by a request that
    never got an answer); every other answer is final.
    """
    assert settings.enrollment_token is not None
    payload = {
        "token": settings.enrollment_token,
        "name": settings.name,
        "accelerator": accelerator.kind,
        "agent_version": __version__,
        "agent_url": settings.agent_url,
    }
    failures = 0
    while not stop.is_set():
        try:
            enrollment = client.enroll(payload)
        except ControlPlaneError as exc:
            if isinstance(exc, ControlPlaneRefused) and not exc.retryable:
                raise _enrollment_refusal(settings, exc) from None
            failures += 1
            delay = backoff_delay(settings.heartbeat_interval_s, failures, rng)
            logger.warning("enrollment failed: %s; retrying in %.0f s", exc, delay)
            stop.wait(delay)
            continue
        identity = Identity(
            node_id=enrollment.node_id,
            node_name=enrollment.node_name,
            credential=enrollment.credential,
            control_plane_url=settings.control_plane_url,
            heartbeat_interval_s=enrollment.heartbeat_interval_s,
            enrolled_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        try:
            save_identity(settings.identity_path, identity)
        except OSError as exc:
            raise StartRefused(
                AGENT_HOME_NOT_WRITABLE,
                f"enrolled as node {identity.node_id} but could not write {settings.identity_path} "
                f"({exc.strerror}); the token is now spent: make {STATE_VOLUME} writable and durable, "
                "remove the node in the control plane and mint a new token",
            ) from exc
        logger.info(
            "enrolled as node %s (%s); identity saved to %s",
            identity.node_id,
            identity.node_name,
            settings.identity_path,
        )
        return identity
    return None


def obtain_identity(
    settings: AgentSettings, accelerator: Accelerator, client: ControlPlaneClient, stop: threading.Event
) -> Identity | None:
    """The persisted identity; enrollment only when there is none. A node never enrolls twice."""
    try:
        identity = load_identity(settings.identity_path)
    except IdentityFileInvalid as exc:
        # Not replaced by a fresh enrollment: that would be the node reappearing with a new identity.
        raise StartRefused(
            IDENTITY_FILE_INVALID,
            f"{exc}; restore it from a backup of {STATE_VOLUME}, or remove the node in the control plane, "
            "delete the file and enroll with a new token",
        ) from exc
    if identity is None:
        return enroll(settings, accelerator, client, stop)
    if identity.control_plane_url and identity.control_plane_url != settings.control_plane_url:
        logger.warning(
            "this node enrolled with %s but %s is now %s; its credential is only valid on the former",
            identity.control_plane_url,
            CONTROL_PLANE_URL,
            settings.control_plane_url,
        )
    if settings.enrollment_token:
        logger.info("node identity present; %s is not used again and may be removed", ENROLLMENT_TOKEN)
    logger.info(
        "node %s (%s): identity loaded from %s", identity.node_id, identity.node_name, settings.identity_path
    )
    return identity


def run(environ: Mapping[str, str], stop: threading.Event | None = None) -> int:
    """Start the agent; returns the exit status.

    1. Settings, every problem collected.
    2. A writable home and state volume, before anything could import a model engine.
    3. The accelerator: configured for NVIDIA, NVML must work, before any request leaves.
    4. The identity: loaded, or enrolled once with the token.
    5. The listening server (a thread) and the heartbeat loop (this thread) until ``stop``.
    """
    stop = stop or threading.Event()
    settings, problems = load_settings(environ)
    if settings is None:
        return _refuse(refusal_text(problems))
    logging.getLogger("agent").setLevel(settings.log_level)
    problems = check_writable(settings, environ)
    if problems:
        return _refuse(refusal_text(problems))
    try:
        accelerator = detect_accelerator(settings.accelerator_mode, environ)
    except AcceleratorRefusal as exc:
        return _refuse(StartRefused(exc.code, exc.message).text())
    logger.info("modelforge-agent %s: accelerator %s (%s)", __version__, accelerator.kind, accelerator.reason)

    client = ControlPlaneClient(settings.control_plane_url)
    server: AgentServer | None = None
    signals: EngineSignalReader | None = None
    try:
        identity = obtain_identity(settings, accelerator, client, stop)
        if identity is None:
            return EXIT_OK
        processes = ProcessManager(settings.models_dir, state_file=settings.state_volume / SERVERS_FILE_NAME)
        processes.adopt()  # servers a crashed previous run left running are reported, not lost
        replicas = ReplicaManager(settings.models_dir, identity.credential, settings.control_plane_url)
        context = AgentContext(
            settings.cluster_secret,
            identity.node_id,
            identity.node_name,
            settings.models_dir,
            processes,
            replicas,
        )
        try:
            server = AgentServer((settings.listen_host, settings.port), context)
        except OSError as exc:
            raise StartRefused(
                AGENT_PORT_UNAVAILABLE,
                f"cannot listen on {settings.listen_host}:{settings.port} ({exc.strerror}); free the port "
                "or set MODELFORGE_AGENT_PORT / MODELFORGE_AGENT_LISTEN_HOST",
            ) from exc
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="agent-server", daemon=True
        ).start()
        logger.info(
            "listening on %s:%s; the control plane calls back on %s",
            settings.listen_host,
            settings.port,
            settings.agent_url,
        )
        # The model servers this agent launched: their GPU memory is "managed", the rest external.
        # Their engines' load (running, waiting, KV cache), where the engine publishes it.
        signals = reader = EngineSignalReader()  # ``reader``: never None, for the closure
        loop = HeartbeatLoop(
            client,
            identity.credential,
            lambda: heartbeat_payload(settings, accelerator, processes.pids(), reader.read(processes.all())),
            # The first heartbeat goes out at once; its answer carries the control plane's interval.
            settings.heartbeat_interval_s,
            stop,
        )
        loop.run()
        logger.info("stopping")
        return EXIT_OK
    except StartRefused as exc:
        return _refuse(exc.text())
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
            # Model servers do not outlive their agent: nothing would watch or report them.
            if server.context.processes is not None:
                server.context.processes.stop_all()
        if signals is not None:
            signals.close()
        client.close()
        accelerator.shutdown()
