"""The node's identity: what one enrollment bought, persisted on the state volume.

Enrollment is single use, so losing this file means the node cannot come back without an operator
minting a new token — and the seeds say a node never reappears with a new identity. It is therefore
written atomically (a temporary file in the same directory, fsync, ``os.replace``, fsync of the
directory) so a crash leaves either the old file or the new one, never half of one; and readable by
the agent's user only (0600), because it holds the node credential.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

IDENTITY_FILE_INVALID = "IDENTITY_FILE_INVALID"
FILE_MODE = 0o600


class IdentityFileInvalid(Exception):
    """The identity file exists but cannot be used; never silently replaced by a new enrollment."""


@dataclass(frozen=True)
class Identity:
    """A node's identity and credential as the control plane issued them at enrollment."""

    node_id: str
    node_name: str
    credential: str
    control_plane_url: str
    heartbeat_interval_s: int
    enrolled_at: str

    def __repr__(self) -> str:  # the credential never reaches a log through a repr
        return f"Identity(node_id={self.node_id!r}, node_name={self.node_name!r})"


def load_identity(path: Path) -> Identity | None:
    """The identity stored at ``path``; ``None`` when there is none yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityFileInvalid(f"cannot read {path} ({exc.strerror})") from exc
    try:
        data = json.loads(text)
        identity = Identity(
            node_id=str(data["node_id"]),
            node_name=str(data["node_name"]),
            credential=str(data["credential"]),
            control_plane_url=str(data.get("control_plane_url", "")),
            heartbeat_interval_s=int(data.get("heartbeat_interval_s", 0)),
            enrolled_at=str(data.get("enrolled_at", "")),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise IdentityFileInvalid(f"{path} is not a node identity written by this agent ({exc})") from exc
    if not identity.node_id or not identity.credential:
        raise IdentityFileInvalid(f"{path} has an empty node_id or credential")
    return identity


def save_identity(path: Path, identity: Identity) -> None:
    """Write ``identity`` to ``path`` atomically with mode 0600.

    1. Create a temporary file in the same directory (``os.replace`` is atomic only within one
       filesystem); ``mkstemp`` creates it 0600, and the mode is set again in case of an odd umask.
    2. Write, flush and fsync it, so the bytes are on disk before the name points at them.
    3. ``os.replace`` it over ``path``, then fsync the directory so the rename itself is durable.
    On any failure the temporary file is removed and ``path`` is left as it was.
    """
    payload = json.dumps(asdict(identity), indent=2, sort_keys=True) + "\n"
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
