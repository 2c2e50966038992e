"""Runtime profiles: manifests in ``config/runtimes/*.toml`` saying how to run a model server.

Loaded once at start-up and validated strictly: every problem is reported with its file and field,
and a ``config/`` that is missing or empty is named as not mounted. Pure Python (stdlib ``tomllib``),
so settings can load it before Django starts.

A profile::

    name = "embeddings-cpu"          # unique; what a model server names
    engine = "embeddings"            # vllm | llamacpp | embeddings | test
    accelerator = "cpu"              # nvidia | cpu
    local_node_only = false          # true for GGUF (llamacpp) servers: never started remotely
    [memory]
    rule = "fixed"                   # fixed: per_gpu_gib; weights_factor: factor x weights + overhead_gib
    per_gpu_gib = 2.0
    [shm]
    min_gib = 0.5                    # /dev/shm the node must have
    [launch]
    command = "python"
    args = ["-m", "engine", "--port", "{port}", "--model", "{model_path}"]
    health_path = "/health"
    ready_check = "chat"             # none | chat | embeddings: after health answers, one real inference
    env = { KEY = "value" }
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = ("vllm", "llamacpp", "embeddings", "test")
ACCELERATORS = ("nvidia", "cpu")
MEMORY_RULES = ("fixed", "weights_factor")
READY_CHECKS = ("none", "chat", "embeddings")
PLACEHOLDERS = (
    "{python}",
    "{port}",
    "{model_path}",
    "{model}",
    "{server_id}",
    "{gpu_indexes}",
    "{gpu_count}",
)
GIB = 2**30

CONFIG_NOT_MOUNTED = "CONFIG_NOT_MOUNTED"
INVALID_MANIFEST = "INVALID_MANIFEST"


@dataclass(frozen=True)
class LaunchTemplate:
    command: str
    args: tuple[str, ...]
    health_path: str
    env: dict[str, str] = field(default_factory=dict)
    # What proves the model answers (the agent's readiness, after the health path): a one-token chat
    # completion, one embedding, or nothing (health only). A crashing engine never reports running.
    ready_check: str = "none"


@dataclass(frozen=True)
class RuntimeProfile:
    """How to run one kind of model server, and what it needs from a node."""

    name: str
    engine: str
    accelerator: str
    local_node_only: bool
    memory_rule: str
    per_gpu_bytes: int
    weights_factor: float
    overhead_bytes: int
    shm_bytes: int
    launch: LaunchTemplate
    source: str

    def memory_need(self, weights_bytes: int | None, gpus: int) -> tuple[int, str]:
        """Bytes needed on each GPU (or of RAM on a cpu node), and the rule used, in words."""
        if self.memory_rule == "fixed":
            return (
                self.per_gpu_bytes,
                f"fixed {self.per_gpu_bytes / GIB:.1f} GiB per {'GPU' if gpus else 'node'}",
            )
        weights = weights_bytes or 0
        share = weights / max(gpus, 1)
        need = int(share * self.weights_factor) + self.overhead_bytes
        return need, (
            f"{self.weights_factor:g} x {share / GIB:.1f} GiB of weights"
            f"{' per GPU' if gpus > 1 else ''} + {self.overhead_bytes / GIB:.1f} GiB overhead"
        )


@dataclass
class ProfileProblem:
    code: str
    where: str
    message: str


def load_profiles(config_dir: Path) -> tuple[dict[str, RuntimeProfile], list[ProfileProblem]]:
    """Every profile under ``config_dir/runtimes``, and every problem found (never the first only)."""
    runtimes = config_dir / "runtimes"
    problems: list[ProfileProblem] = []
    try:
        files = sorted(runtimes.glob("*.toml")) if runtimes.is_dir() else []
    except OSError as exc:
        files = []
        problems.append(ProfileProblem(CONFIG_NOT_MOUNTED, str(runtimes), f"cannot be read ({exc.strerror})"))
    if not files and not problems:
        problems.append(
            ProfileProblem(
                CONFIG_NOT_MOUNTED,
                str(runtimes),
                "holds no runtime profile (*.toml): the config directory is not mounted or is empty; "
                "mount the repository's config/ there or set MODELFORGE_CONFIG_DIR",
            )
        )
    profiles: dict[str, RuntimeProfile] = {}
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            problems.append(ProfileProblem(INVALID_MANIFEST, str(path), f"cannot be parsed: {exc}"))
            continue
        profile = _profile(path, data, problems)
        if profile is None:
            continue
        if profile.name in profiles:
            problems.append(
                ProfileProblem(
                    INVALID_MANIFEST,
                    f"{path}: name",
                    f"{profile.name!r} is also defined in {profiles[profile.name].source}",
                )
            )
            continue
        profiles[profile.name] = profile
    return profiles, problems


class _Reader:
    """Reads typed fields of one manifest, recording each problem with its file and field."""

    def __init__(self, path: Path, data: dict[str, Any], problems: list[ProfileProblem]) -> None:
        self.path, self.data, self.problems = path, data, problems
        self.ok = True

    def fail(self, field_name: str, message: str) -> None:
        self.ok = False
        self.problems.append(ProfileProblem(INVALID_MANIFEST, f"{self.path}: {field_name}", message))

    def get(self, dotted: str, kind: type | tuple[type, ...], default: Any = ..., choices: tuple = ()) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is ...:
                    self.fail(dotted, "is required")
                    return None
                return default
            node = node[part]
        if isinstance(node, bool) and kind in (int, float, (int, float)):
            self.fail(dotted, f"must be a number, not {node!r}")
            return None
        if not isinstance(node, kind):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(dotted, f"must be {expected}, not {type(node).__name__}")
            return None
        if choices and node not in choices:
            self.fail(dotted, f"{node!r} is not one of {', '.join(choices)}")
            return None
        return node

    def unknown(self, section: dict[str, Any], allowed: set[str], prefix: str = "") -> None:
        for key in sorted(set(section) - allowed):
            self.fail(f"{prefix}{key}", "is not a known field")


def _profile(path: Path, data: dict[str, Any], problems: list[ProfileProblem]) -> RuntimeProfile | None:
    r = _Reader(path, data, problems)
    r.unknown(data, {"name", "engine", "accelerator", "local_node_only", "memory", "shm", "launch"})
    name = r.get("name", str)
    if isinstance(name, str) and not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        r.fail("name", "use letters, digits, '-', '_' and '.' only")
    engine = r.get("engine", str, choices=ENGINES)
    accelerator = r.get("accelerator", str, choices=ACCELERATORS)
    local_only = r.get("local_node_only", bool, default=engine == "llamacpp")
    if engine == "llamacpp" and local_only is False:
        r.fail("local_node_only", "llamacpp (GGUF) servers are local-node only; remove the field or set true")
    for section, allowed in (
        ("memory", {"rule", "per_gpu_gib", "weights_factor", "overhead_gib"}),
        ("shm", {"min_gib"}),
        ("launch", {"command", "args", "health_path", "env", "ready_check"}),
    ):
        value = data.get(section, {})
        if isinstance(value, dict):
            r.unknown(value, allowed, f"{section}.")
    rule = r.get("memory.rule", str, choices=MEMORY_RULES)
    per_gpu = r.get("memory.per_gpu_gib", (int, float), default=0) if rule == "fixed" else 0
    if rule == "fixed" and (per_gpu is None or per_gpu <= 0):
        r.fail("memory.per_gpu_gib", "the fixed rule needs a positive per_gpu_gib")
    factor = r.get("memory.weights_factor", (int, float), default=1.2)
    overhead = r.get("memory.overhead_gib", (int, float), default=0.5)
    if rule == "weights_factor" and factor is not None and factor < 1:
        r.fail("memory.weights_factor", "must be at least 1 (the weights themselves must fit)")
    if overhead is not None and overhead < 0:
        r.fail("memory.overhead_gib", "must not be negative")
    shm = r.get("shm.min_gib", (int, float), default=0)
    if shm is not None and shm < 0:
        r.fail("shm.min_gib", "must not be negative")
    command = r.get("launch.command", str)
    args = r.get("launch.args", list, default=[])
    if isinstance(args, list) and not all(isinstance(a, str) for a in args):
        r.fail("launch.args", "every argument must be a string")
    if isinstance(args, list) and "{port}" not in " ".join(str(a) for a in args):
        r.fail("launch.args", "must pass {port}: the agent chooses the port the server listens on")
    health = r.get("launch.health_path", str, default="/health")
    if isinstance(health, str) and not health.startswith("/"):
        r.fail("launch.health_path", "must start with '/'")
    ready = r.get("launch.ready_check", str, default="none", choices=READY_CHECKS)
    env = r.get("launch.env", dict, default={})
    if isinstance(env, dict) and not all(isinstance(v, str) for v in env.values()):
        r.fail("launch.env", "every value must be a string")
    for field_name, texts in (
        ("launch.command", [command] if isinstance(command, str) else []),
        ("launch.args", [a for a in args if isinstance(a, str)] if isinstance(args, list) else []),
        ("launch.env", [v for v in env.values() if isinstance(v, str)] if isinstance(env, dict) else []),
    ):
        unknown = sorted({m for t in texts for m in re.findall(r"\{[^{}]*\}", t)} - set(PLACEHOLDERS))
        if unknown:
            r.fail(
                field_name, f"unknown placeholder(s) {', '.join(unknown)}; known: {', '.join(PLACEHOLDERS)}"
            )
    if not r.ok:
        return None
    return RuntimeProfile(
        name=name,
        engine=engine,
        accelerator=accelerator,
        local_node_only=bool(local_only),
        memory_rule=rule,
        per_gpu_bytes=int(float(per_gpu or 0) * GIB),
        weights_factor=float(factor),
        overhead_bytes=int(float(overhead) * GIB),
        shm_bytes=int(float(shm) * GIB),
        launch=LaunchTemplate(command, tuple(args), health, dict(env), ready or "none"),
        source=str(path),
    )
