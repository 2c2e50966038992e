"""The agent's settings: ``MODELFORGE_AGENT_*`` environment variables, read strictly.

Every problem is collected (never first-fail), each with a code and the setting at fault, and the agent
refuses to start with the whole list. The reading rules are the control plane's too, in one shared module
(``agent/envreader.py``): whitespace trimmed, empty means unset, ``<NAME>_FILE`` for any setting (meant
for the enrollment token and the cluster secret, mounted as Docker/Kubernetes secrets; setting both, or
naming an unreadable or empty file, is a problem), choices matched exactly, case included.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from agent import envreader
from agent.envreader import (
    INVALID_SETTING,
    MISSING_REQUIRED_SETTING,
    EnvReader,
    Problem,
    Program,
)

PREFIX = "MODELFORGE_AGENT_"
CONTROL_PLANE_URL = "MODELFORGE_AGENT_CONTROL_PLANE_URL"
ENROLLMENT_TOKEN = "MODELFORGE_AGENT_ENROLLMENT_TOKEN"
STATE_VOLUME = "MODELFORGE_AGENT_STATE_VOLUME"
ACCELERATOR_MODE = "MODELFORGE_AGENT_ACCELERATOR_MODE"
CLUSTER_SECRET = "MODELFORGE_AGENT_CLUSTER_SECRET"
LISTEN_HOST = "MODELFORGE_AGENT_LISTEN_HOST"
PORT = "MODELFORGE_AGENT_PORT"
HEARTBEAT_INTERVAL = "MODELFORGE_AGENT_HEARTBEAT_INTERVAL"
NAME = "MODELFORGE_AGENT_NAME"
MODELS_DIR = "MODELFORGE_AGENT_MODELS_DIR"
ADVERTISE_HOST = "MODELFORGE_AGENT_ADVERTISE_HOST"
LOG_LEVEL = "MODELFORGE_AGENT_LOG_LEVEL"

PLACEHOLDER_CONTROL_PLANE_URL = "PLACEHOLDER_CONTROL_PLANE_URL"

# MODELFORGE_AGENT_* names that are not the agent's but are legitimately in its environment: the control
# plane's timeout for calls to agents (make run hands the local agent the control plane's environment)
# and Compose's interpolation of the agent container's shared memory. Every name the reader is asked for,
# and its _FILE, is known without being listed.
KNOWN_ELSEWHERE = frozenset({"MODELFORGE_AGENT_CALL_TIMEOUT", "MODELFORGE_AGENT_SHM_SIZE"})
AGENT = Program(
    prefix=PREFIX,
    title="modelforge-agent",
    docs="agent/README.md",
    no_match="no agent setting of that name exists",
    known_elsewhere=KNOWN_ELSEWHERE,
)

DEFAULT_STATE_VOLUME = "/var/lib/modelforge-agent"
DEFAULT_LISTEN_HOST = "0.0.0.0"  # noqa: S104 -- the control plane must reach the agent's port
DEFAULT_PORT = 8471
DEFAULT_HEARTBEAT_INTERVAL_S = 10
MIN_HEARTBEAT_INTERVAL_S = 1
MAX_HEARTBEAT_INTERVAL_S = 300
MIN_CLUSTER_SECRET_LENGTH = 16
IDENTITY_FILE_NAME = "identity.json"

ACCELERATOR_MODES = ("auto", "nvidia", "cpu")
# The control plane's rule for node names, checked here so a bad name is refused before enrollment.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# What a copied-and-never-edited sample configuration looks like. A URL containing one of these is
# named as a placeholder rather than tried: its failures would otherwise look like a network fault.
PLACEHOLDER_MARKERS = (
    "example.com",
    "example.org",
    "example.net",
    "changeme",
    "change-me",
    "your-",
    "<",
    ">",
    "placeholder",
    "localhost.invalid",
    "${",
)


def refusal_text(problems: list[Problem]) -> str:
    return envreader.refusal_text("modelforge-agent", problems)


@dataclass(frozen=True)
class AgentSettings:
    """The validated settings the agent runs with."""

    control_plane_url: str
    enrollment_token: str | None
    state_volume: Path
    accelerator_mode: str
    cluster_secret: str
    listen_host: str
    port: int
    heartbeat_interval_s: int
    name: str
    models_dir: Path
    advertise_host: str
    log_level: str = "INFO"

    @property
    def identity_path(self) -> Path:
        return self.state_volume / IDENTITY_FILE_NAME

    @property
    def agent_url(self) -> str:
        """Where the control plane calls this agent back (an IPv6 literal goes in brackets)."""
        host = f"[{self.advertise_host}]" if ":" in self.advertise_host else self.advertise_host
        return f"http://{host}:{self.port}"


def is_placeholder(value: str) -> bool:
    lowered = value.lower()
    if any(marker in lowered for marker in PLACEHOLDER_MARKERS):
        return True
    host = (urlsplit(lowered).hostname or "") if "://" in lowered else lowered
    # RFC 2606 reserves .example (and example.*) for documentation.
    return host == "example" or host.endswith(".example")


class _Reader(EnvReader):
    """The shared strict reader (agent/envreader.py) over the agent's ``MODELFORGE_AGENT_*`` names."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(environ, AGENT)


def _control_plane_url(read: _Reader) -> str:
    value = read.raw(CONTROL_PLANE_URL)
    if value is None:
        read.problem(
            MISSING_REQUIRED_SETTING,
            CONTROL_PLANE_URL,
            "set it to the control plane's base URL, e.g. https://modelforge.lan:8000",
        )
        return ""
    if is_placeholder(value):
        read.problem(
            PLACEHOLDER_CONTROL_PLANE_URL,
            CONTROL_PLANE_URL,
            f"{value!r} is still a placeholder from a sample configuration; set it to the URL at which "
            "this node reaches the control plane",
        )
        return ""
    expected = "an http:// or https:// URL with a host name"
    if not read.check_url(CONTROL_PLANE_URL, value, schemes=("http", "https"), expected=expected):
        return ""
    parts = urlsplit(value)
    if parts.query or parts.fragment or parts.username or parts.password:
        read.problem(
            INVALID_SETTING,
            CONTROL_PLANE_URL,
            "give only scheme, host, port and (optionally) a path prefix: no credentials, query or fragment",
        )
        return ""
    return value.rstrip("/")


def _host(read: _Reader, name: str, value: str, *, advertised: bool) -> str:
    if any(char.isspace() for char in value) or "/" in value or "://" in value:
        read.problem(INVALID_SETTING, name, f"{value!r} is not a host name or IP address")
        return value
    if advertised:
        if is_placeholder(value):
            read.problem(
                INVALID_SETTING, name, f"{value!r} is a placeholder; set the host the control plane reaches"
            )
            return value
        try:
            unspecified = ipaddress.ip_address(value).is_unspecified
        except ValueError:
            unspecified = False
        if unspecified:
            read.problem(
                INVALID_SETTING,
                name,
                f"{value!r} is a listening address, not one the control plane can call; "
                "set the node's host name or IP address",
            )
    return value


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # unreadable: the home and state volume check reports it next
        return False


def load_settings(environ: Mapping[str, str]) -> tuple[AgentSettings | None, list[Problem]]:
    """The settings, or ``None`` with every problem found. Reads only ``environ``."""
    read = _Reader(environ)
    hostname = socket.gethostname()

    url = _control_plane_url(read)
    state_volume = read.path(STATE_VOLUME, Path(DEFAULT_STATE_VOLUME))
    token = read.raw(ENROLLMENT_TOKEN)
    # The token is spent at the first enrollment; afterwards the identity file stands in for it.
    if (
        token is None
        and not read.reported(ENROLLMENT_TOKEN)
        and not _exists(state_volume / IDENTITY_FILE_NAME)
    ):
        read.problem(
            MISSING_REQUIRED_SETTING,
            ENROLLMENT_TOKEN,
            f"this node has no identity yet ({state_volume / IDENTITY_FILE_NAME} does not exist); "
            "mint an enrollment token in the control plane and set it (or "
            f"{ENROLLMENT_TOKEN}_FILE)",
        )

    mode = read.choice(ACCELERATOR_MODE, "auto", ACCELERATOR_MODES)

    secret = read.raw(CLUSTER_SECRET)
    if secret is None and not read.reported(CLUSTER_SECRET):
        read.problem(
            MISSING_REQUIRED_SETTING,
            CLUSTER_SECRET,
            "set it (or MODELFORGE_AGENT_CLUSTER_SECRET_FILE) to the control plane's cluster secret",
        )
    elif secret is not None and len(secret) < MIN_CLUSTER_SECRET_LENGTH:
        read.problem(
            INVALID_SETTING,
            CLUSTER_SECRET,
            f"the cluster secret is {len(secret)} characters; use the control plane's cluster secret "
            f"(at least {MIN_CLUSTER_SECRET_LENGTH} characters)",
        )

    listen_host = _host(read, LISTEN_HOST, read.raw(LISTEN_HOST) or DEFAULT_LISTEN_HOST, advertised=False)
    port = read.integer(PORT, DEFAULT_PORT, minimum=1, maximum=65535)
    interval = read.integer(
        HEARTBEAT_INTERVAL,
        DEFAULT_HEARTBEAT_INTERVAL_S,
        minimum=MIN_HEARTBEAT_INTERVAL_S,
        maximum=MAX_HEARTBEAT_INTERVAL_S,
    )
    name = read.raw(NAME) or hostname
    if not NODE_NAME.match(name):
        origin = "" if read.raw(NAME) else f" (the host name; set {NAME})"
        read.problem(
            INVALID_SETTING,
            NAME,
            f"{name!r}{origin} is not a node name: use 1-63 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit",
        )
    models_dir = read.path(MODELS_DIR, state_volume / "models")
    advertise_host = _host(read, ADVERTISE_HOST, read.raw(ADVERTISE_HOST) or hostname, advertised=True)
    log_level = read.choice(LOG_LEVEL, "INFO", LOG_LEVELS)
    # Last, once every setting has been read.
    read.report_unknown()

    if read.problems:
        return None, read.problems
    assert secret is not None
    return (
        AgentSettings(
            control_plane_url=url,
            enrollment_token=token,
            state_volume=state_volume,
            accelerator_mode=mode,
            cluster_secret=secret,
            listen_host=listen_host,
            port=port,
            heartbeat_interval_s=interval,
            name=name,
            models_dir=models_dir,
            advertise_host=advertise_host,
            log_level=log_level,
        ),
        [],
    )
