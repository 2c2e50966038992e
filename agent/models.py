"""Which models are on this node's disk: the presence check the control plane asks before a launch.

Seeds (Troubleshooting): the check "understands a weights directory, a single .gguf file, or a
directory containing one, so a GGUF-only replica is correctly seen". A model is an entry directly
under the models directory, named by that entry's name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("agent.models")

WEIGHTS_DIRECTORY = "weights_directory"
GGUF_FILE = "gguf_file"
GGUF_DIRECTORY = "gguf_directory"

WEIGHT_SUFFIXES = (".safetensors", ".bin")
GGUF_SUFFIX = ".gguf"
CONFIG_FILE = "config.json"
MAX_NAME_LENGTH = 255


class InvalidModelName(ValueError):
    """A name that is not a single entry of the models directory (traversal, absolute path, ...)."""


@dataclass(frozen=True)
class Presence:
    """The answer for one model name: whether it is on disk, and in which layout."""

    model: str
    present: bool
    kind: str | None

    def as_payload(self) -> dict[str, object]:
        return {"model": self.model, "present": self.present, "kind": self.kind}


def validate_name(name: object) -> str:
    """``name`` when it names an entry directly under the models directory, else ``InvalidModelName``."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidModelName("model must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidModelName(f"model must be at most {MAX_NAME_LENGTH} characters")
    if "\x00" in name or "/" in name or "\\" in name:
        raise InvalidModelName("model must be one entry of the models directory, without path separators")
    if name in (".", "..") or ".." in name:
        raise InvalidModelName("model must not contain '..'")
    return name


def _layout(path: Path) -> str | None:
    """The layout of one entry, or ``None`` when it holds no model weights."""
    if path.is_file():
        return GGUF_FILE if path.name.lower().endswith(GGUF_SUFFIX) and path.stat().st_size > 0 else None
    if not path.is_dir():
        return None
    has_gguf = has_weights = has_config = False
    for child in path.iterdir():
        lowered = child.name.lower()
        if not child.is_file():
            continue
        if lowered.endswith(GGUF_SUFFIX):
            has_gguf = True
        elif lowered.endswith(WEIGHT_SUFFIXES):
            has_weights = True
        elif lowered == CONFIG_FILE:
            has_config = True
    # GGUF weights beside a config.json are still served by a GGUF engine: call it what it is.
    if has_gguf and not has_weights:
        return GGUF_DIRECTORY
    if has_weights or has_config or has_gguf:
        return WEIGHTS_DIRECTORY
    return None


def check_presence(models_dir: Path, name: object) -> Presence:
    """Whether ``name`` is present under ``models_dir``. Raises ``InvalidModelName`` for a bad name."""
    valid = validate_name(name)
    path = models_dir / valid
    # Belt and braces: the joined path must still sit directly in the models directory.
    if path.parent != models_dir:
        raise InvalidModelName("model must be one entry of the models directory")
    try:
        kind = _layout(path)
    except OSError as exc:
        logger.warning("presence check of %r could not read %s (%s)", valid, path, exc.strerror)
        kind = None
    return Presence(valid, kind is not None, kind)


def models_present(models_dir: Path) -> list[Presence]:
    """Every entry directly under ``models_dir`` that passes the presence check, by name.

    Hidden entries (a download in progress writes to one) are not models yet.
    """
    try:
        entries = sorted(entry.name for entry in models_dir.iterdir() if not entry.name.startswith("."))
    except FileNotFoundError:
        return []
    except OSError as exc:
        logger.warning("cannot list the models directory %s (%s)", models_dir, exc.strerror)
        return []
    found: list[Presence] = []
    for name in entries:
        try:
            presence = check_presence(models_dir, name)
        except InvalidModelName:
            continue
        if presence.present:
            found.append(presence)
    return found
