"""Runtime profiles: manifests in ``config/runtimes/*.toml`` saying how to run a model server.

Loaded once per process, when the servers app is ready (``ServersConfig.ready``, before any entry point's
start-up check; ``runtime_profiles()`` answers them), and validated strictly: every problem is reported
with its file and field, and a ``config/`` that is missing or empty is named as not mounted. The
manifest's shape is declared as msgspec structs (``Manifest`` and its tables): each field's type, default
and constraint is there, and ``_check`` converts field by field so that every wrong field of a file is
reported, not only the first. The rules that span fields (``_RULES``) run on the fields that converted.

A profile::

    name = "embeddings-cpu"          # unique; what a model server names
    engine = "embeddings"            # vllm | llamacpp | embeddings | test
    accelerator = "cpu"              # nvidia | cpu
    local_node_only = false          # true for GGUF (llamacpp) servers: never started remotely
    endpoints = ["embeddings"]       # chat | completions | embeddings: what the engine serves (the gateway
                                     # refuses the rest, ENDPOINT_NOT_SERVED); unset: the engine's default
    max_concurrent = 8               # 1-10000: requests the gateway sends one server at once (the rest
                                     # wait in its queue, apps/gateway/admission.py); unset: no limit
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

Engine = Literal["vllm", "llamacpp", "embeddings", "test"]
Accelerator = Literal["nvidia", "cpu"]
MemoryRule = Literal["fixed", "weights_factor"]
ReadyCheck = Literal["none", "chat", "embeddings"]
Endpoint = Literal["chat", "completions", "embeddings"]
ENGINES: tuple[str, ...] = get_args(Engine)
ACCELERATORS: tuple[str, ...] = get_args(Accelerator)
MEMORY_RULES: tuple[str, ...] = get_args(MemoryRule)
READY_CHECKS: tuple[str, ...] = get_args(ReadyCheck)
# The OpenAI path of each endpoint a profile may declare.
ENDPOINT_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
# What an engine serves when its profile does not say (declare it: a model decides as much as its engine).
ENGINE_ENDPOINTS: dict[str, tuple[str, ...]] = {
    "vllm": ("chat", "completions"),
    "llamacpp": ("chat", "completions"),
    "embeddings": ("embeddings",),
    "test": ("chat", "embeddings"),
}
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

# A constraint's description is the problem's message when a value of the right type breaks it.
ProfileName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[-_.]*[^\W_][-\w.]*$", description="use letters, digits, '-', '_' and '.' only"),
]
NotNegative = Annotated[float, msgspec.Meta(ge=0, description="must not be negative")]
HealthPath = Annotated[str, msgspec.Meta(pattern="^/", description="must start with '/'")]
MAX_CONCURRENT_AT_MOST = 10000
MaxConcurrent = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=MAX_CONCURRENT_AT_MOST,
        description=f"must be a whole number from 1 to {MAX_CONCURRENT_AT_MOST} (leave it out for no limit)",
    ),
]


# Each table of a manifest: any key it does not declare is refused ("is not a known field").
class MemorySpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    rule: MemoryRule
    per_gpu_gib: float = 0  # the fixed rule: required and positive (_RULES)
    weights_factor: float = 1.2  # the weights_factor rule: at least 1 (_RULES)
    overhead_gib: NotNegative = 0.5


class ShmSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    min_gib: NotNegative = 0


class LaunchSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    command: str
    args: list[str] = []
    health_path: HealthPath = "/health"
    ready_check: ReadyCheck = "none"
    env: dict[str, str] = {}


class Manifest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ProfileName
    engine: Engine
    accelerator: Accelerator
    memory: MemorySpec
    launch: LaunchSpec
    shm: ShmSpec = ShmSpec()
    local_node_only: bool | None = None  # unset: true for llamacpp, false otherwise
    endpoints: list[Endpoint] | None = None  # unset: ENGINE_ENDPOINTS[engine]
    max_concurrent: MaxConcurrent | None = None  # unset: the gateway holds no request back


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
    # The OpenAI paths its engine serves (ENDPOINT_PATHS): the gateway refuses the others.
    endpoints: frozenset[str] = frozenset(ENDPOINT_PATHS.values())
    # Requests the gateway sends one of its servers at once; None: no limit (apps/gateway/admission.py).
    max_concurrent: int | None = None

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


_installed: dict[str, RuntimeProfile] | None = None


def install(config_dir: Path) -> list[ProfileProblem]:
    """Load the profiles under ``config_dir`` as this process's own; return their problems.

    ``ServersConfig.ready`` calls it once per process, so that start-up validation reports the problems.
    """
    global _installed
    _installed, problems = load_profiles(config_dir)
    return problems


def runtime_profiles() -> dict[str, RuntimeProfile]:
    """This process's runtime profiles by name: those ``install`` loaded when the servers app became
    ready (a bad file is left out and was reported at start-up)."""
    if _installed is None:  # no app registry in this process: load them now, from the settings
        from django.conf import settings

        install(settings.CONFIG_DIR)
    assert _installed is not None
    return _installed


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
        manifest = _check(path, data, problems)
        if manifest is None:
            continue
        profile = _profile(path, manifest)
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


Fields = dict[str, Any]  # dotted field name -> its converted value (the fields that converted)
Fail = Callable[[str, str], None]


def _check(path: Path, data: dict[str, Any], problems: list[ProfileProblem]) -> Manifest | None:
    """The manifest, or ``None`` with every problem of the file recorded."""
    found: list[ProfileProblem] = []

    def fail(where: str, message: str) -> None:
        found.append(ProfileProblem(INVALID_MANIFEST, f"{path}: {where}", message))

    fields: Fields = {}
    _convert_section(Manifest, data, "", fields, fail)
    for rule in _RULES:
        rule(fields, fail)
    problems.extend(found)
    if found:
        return None
    return msgspec.convert(data, Manifest)


def _convert_section(
    section: type[msgspec.Struct], data: object, prefix: str, out: Fields, fail: Fail
) -> None:
    """Convert each field of ``section`` on its own (a missing one takes its default), so that one wrong
    field does not hide the next; each failure is recorded with the field's dotted name."""
    if not isinstance(data, dict):
        fail(prefix.rstrip(".") or "(file)", f"must be a table, not {type(data).__name__}")
        return
    declared = {info.encode_name: info for info in msgspec.structs.fields(section)}
    for key in sorted(set(data) - set(declared)):
        fail(f"{prefix}{key}", "is not a known field")
    for name, info in declared.items():
        where = f"{prefix}{name}"
        if isinstance(info.type, type) and issubclass(info.type, msgspec.Struct):
            _convert_section(info.type, data.get(name, {}), f"{where}.", out, fail)
        elif name in data:
            try:
                out[where] = msgspec.convert(data[name], info.type)
            except msgspec.ValidationError as exc:
                at, message = _explain(exc, data[name], info.type)
                fail(where + at, message)
        elif info.required:
            fail(where, "is required")
        else:
            out[where] = info.default_factory() if info.default is msgspec.NODEFAULT else info.default


def _explain(exc: msgspec.ValidationError, value: object, annotation: Any) -> tuple[str, str]:
    """(where inside the field, what is wrong) for msgspec's error, in the manifest's own words."""
    if get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        if len(inner) == 1 and get_origin(inner[0]) is Annotated:  # an optional constrained value
            annotation = inner[0]
    if get_origin(annotation) is Literal and isinstance(value, str):
        return "", f"{value!r} is not one of {', '.join(get_args(annotation))}"
    if get_origin(annotation) is Annotated:
        base, *metas = get_args(annotation)
        described = [
            meta.description for meta in metas if isinstance(meta, msgspec.Meta) and meta.description
        ]
        if described and _converts(value, base):
            return "", described[0]
    text, _, at = str(exc).partition(" - at `$")
    at = at.rstrip("`").replace("[...]", "")  # a dict value's key is not named by msgspec
    enum = re.fullmatch(r"Invalid enum value (.+)", text)
    choices = _literal_choices(annotation)
    if enum and choices:  # an item of a list of choices
        return at, f"{enum[1]} is not one of {', '.join(choices)}"
    wrong = re.fullmatch(r"Expected `(.+?)`, got `(.+?)`", text)
    if wrong:
        expected = wrong[1].removesuffix(" | null")  # an optional field's "unset" is no value to give
        expected = {"float": "a number", "int": "a whole number"}.get(expected, expected)
        return at, f"must be {expected}, not {wrong[2]}"
    return at, text


def _literal_choices(annotation: Any) -> tuple[str, ...]:
    """The choices of the first ``Literal`` inside ``annotation`` (``list[Endpoint] | None``: Endpoint's)."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    for inner in get_args(annotation):
        if found := _literal_choices(inner):
            return found
    return ()


def _converts(value: object, annotation: Any) -> bool:
    try:
        msgspec.convert(value, annotation)
    except msgspec.ValidationError:
        return False
    return True


# --- rules spanning fields: each sees only the fields that converted -----------------------------------


def _llamacpp_is_local_only(fields: Fields, fail: Fail) -> None:
    if fields.get("engine") == "llamacpp" and fields.get("local_node_only") is False:
        fail("local_node_only", "llamacpp (GGUF) servers are local-node only; remove the field or set true")


def _memory_rule_needs(fields: Fields, fail: Fail) -> None:
    rule = fields.get("memory.rule")
    if rule == "fixed" and fields.get("memory.per_gpu_gib", 1) <= 0:
        fail("memory.per_gpu_gib", "the fixed rule needs a positive per_gpu_gib")
    if rule == "weights_factor" and fields.get("memory.weights_factor", 1) < 1:
        fail("memory.weights_factor", "must be at least 1 (the weights themselves must fit)")


def _launch_passes_the_port(fields: Fields, fail: Fail) -> None:
    if "launch.args" in fields and "{port}" not in " ".join(fields["launch.args"]):
        fail("launch.args", "must pass {port}: the agent chooses the port the server listens on")


def _placeholders_are_known(fields: Fields, fail: Fail) -> None:
    for where in ("launch.command", "launch.args", "launch.env"):
        unknown = sorted(set(_placeholders(fields.get(where))) - set(PLACEHOLDERS))
        if unknown:
            fail(where, f"unknown placeholder(s) {', '.join(unknown)}; known: {', '.join(PLACEHOLDERS)}")


def _ready_check_is_served(fields: Fields, fail: Fail) -> None:
    check, endpoints = fields.get("launch.ready_check"), fields.get("endpoints")
    if endpoints is not None and not endpoints:
        fail("endpoints", "must name at least one of " + ", ".join(ENDPOINT_PATHS))
    elif check in ("chat", "embeddings") and endpoints is not None and check not in endpoints:
        fail("endpoints", f"must include {check!r}: launch.ready_check proves the model with it")


def _placeholders(value: str | list[str] | dict[str, str] | None) -> Iterator[str]:
    if isinstance(value, dict):
        texts = list(value.values())
    elif isinstance(value, str):
        texts = [value]
    else:
        texts = value or []
    for text in texts:
        yield from re.findall(r"\{[^{}]*\}", text)


_RULES: tuple[Callable[[Fields, Fail], None], ...] = (
    _llamacpp_is_local_only,
    _memory_rule_needs,
    _launch_passes_the_port,
    _placeholders_are_known,
    _ready_check_is_served,
)


def _profile(path: Path, manifest: Manifest) -> RuntimeProfile:
    memory, launch = manifest.memory, manifest.launch
    local_only = (
        manifest.engine == "llamacpp" if manifest.local_node_only is None else manifest.local_node_only
    )
    return RuntimeProfile(
        name=manifest.name,
        engine=manifest.engine,
        accelerator=manifest.accelerator,
        local_node_only=local_only,
        memory_rule=memory.rule,
        per_gpu_bytes=int(memory.per_gpu_gib * GIB) if memory.rule == "fixed" else 0,
        weights_factor=memory.weights_factor,
        overhead_bytes=int(memory.overhead_gib * GIB),
        shm_bytes=int(manifest.shm.min_gib * GIB),
        launch=LaunchTemplate(
            launch.command, tuple(launch.args), launch.health_path, dict(launch.env), launch.ready_check
        ),
        source=str(path),
        endpoints=frozenset(
            ENDPOINT_PATHS[e] for e in (manifest.endpoints or ENGINE_ENDPOINTS[manifest.engine])
        ),
        max_concurrent=manifest.max_concurrent,
    )
