"""Replicas: the agent fetches an artifact's files from the control plane's store, resumably, verifies
every file's digest, and only then moves it where the presence check finds it. A replica that fails
verification is never placed, so it is never reported present.

Which digest: BLAKE3 where the artifact's record carries one (recorded at acquisition beside the
SHA-256, which stays the artifact's identity) and the ``blake3`` package is installed here, otherwise
SHA-256, which every record carries. SHA-256 on one core bound the copy (about 1 GB/s beside the
receive); BLAKE3 hashes the same bytes at about twice that per core, and on more than one. A file whose
record has no digest this agent can check is refused before the copy starts (``REPLICA_DIGEST_MISSING``,
``agent.server``), never copied unverified."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from agent import transfer

try:  # a dependency of the agent; an install without it still verifies, with SHA-256
    import blake3
except ImportError:  # pragma: no cover - the test environment has it
    blake3 = None  # type: ignore[assignment]

logger = logging.getLogger("agent.replicas")

CHUNK = 8 << 20
ALIGN = 4096  # O_DIRECT: offsets, lengths and addresses in whole blocks
COPYING, PRESENT, FAILED = "copying", "present", "failed"
HEX_DIGEST = frozenset("0123456789abcdef")


class Hasher(Protocol):
    def update(self, data: memoryview | bytes, /) -> object: ...
    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class Verification:
    """The digest one file is checked against: its name in messages, the recorded value, a new hasher."""

    name: str
    expected: str
    new: Callable[[], Hasher]


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX_DIGEST


def verification(item: dict[str, Any]) -> Verification | None:
    """BLAKE3 when the record has one and this agent can compute it, else SHA-256; None when the record
    has neither (the caller refuses the replica: nothing is ever placed unverified)."""
    if blake3 is not None and _is_digest(item.get("blake3")):
        # Multithreaded: each 8 MiB block is spread over the node's cores (BLAKE3 is a tree hash; the
        # result is the same for any thread count).
        return Verification("BLAKE3", item["blake3"], lambda: blake3.blake3(max_threads=blake3.blake3.AUTO))
    if _is_digest(item.get("sha256")):
        return Verification("SHA-256", item["sha256"], hashlib.sha256)
    return None


@dataclass
class Replica:
    replica_id: str
    name: str
    total: int
    done: int = 0
    state: str = COPYING
    reason: str = ""
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def as_payload(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "name": self.name,
            "state": self.state,
            "done_bytes": self.done,
            "total_bytes": self.total,
            "reason": self.reason,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


def reserve(fd: int, size: int) -> None:
    """Allocate the file's blocks up front without changing its size (``FALLOC_FL_KEEP_SIZE``), so a
    resumed transfer still reads how far it got from the size. Writing into allocated blocks measured
    several times faster than growing the file block by block here; where the call is missing (not
    Linux, a filesystem without it) the copy just runs without it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate(ctypes.c_int(fd), ctypes.c_int(1), ctypes.c_longlong(0), ctypes.c_longlong(size))
    except (OSError, AttributeError):
        pass


class BlockWriter:
    """Writes a replica's blocks at increasing offsets, past the page cache (``O_DIRECT``) where the file
    system allows it and the block is aligned, and makes the file durable on close.

    A node's memory belongs to the model servers it runs: copying a 40 GB artifact through the page cache
    would push their weights out of it. Direct writes also leave the CPU to the digest (the bench measured a
    buffered write of new pages at 700-5,000 MiB/s from one run to the next on this VM, a direct one at
    1,900 MiB/s with almost no CPU). A file system without ``O_DIRECT`` (tmpfs), an unaligned resume point
    or the last short block fall back to plain writes for the rest of the file.
    """

    def __init__(self, path: Path, offset: int, size: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (0 if offset else os.O_TRUNC)
        self.direct = False
        self.offset = offset
        if hasattr(os, "O_DIRECT") and offset % ALIGN == 0:
            try:
                self.fd = os.open(path, flags | os.O_DIRECT, 0o644)
                self.direct = True
            except OSError:
                self.fd = os.open(path, flags, 0o644)
        else:
            self.fd = os.open(path, flags, 0o644)
        reserve(self.fd, size)

    def _buffered(self) -> None:
        if self.direct:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False

    def write(self, block: memoryview) -> None:
        while block:
            if self.direct and (len(block) % ALIGN or self.offset % ALIGN):
                self._buffered()
            try:
                written = os.pwrite(self.fd, block, self.offset)
            except OSError as exc:
                if not (self.direct and exc.errno == errno.EINVAL):
                    raise
                self._buffered()  # the file system refused this direct write: the rest goes buffered
                continue
            self.offset += written
            block = block[written:]

    def close(self) -> None:
        try:
            os.fsync(self.fd)
        finally:
            os.close(self.fd)


class ReplicaManager:
    def __init__(self, models_dir: Path, credential: str, control_plane_url: str) -> None:
        self.models_dir = models_dir
        self.credential = credential
        self.control_plane_url = control_plane_url.rstrip("/")
        self._replicas: dict[str, Replica] = {}
        self._lock = threading.Lock()

    def get(self, replica_id: str) -> Replica | None:
        with self._lock:
            return self._replicas.get(replica_id)

    def start(self, spec: dict[str, Any]) -> Replica:
        """``spec``: replica_id, name (a file name for a single .gguf, else a folder name), base_url (the
        control plane's file endpoint for this artifact, relative to its URL), files [{path, size,
        sha256, blake3 (optional)}]."""
        replica_id = str(spec["replica_id"])
        with self._lock:
            existing = self._replicas.get(replica_id)
            if existing is not None and existing.state == COPYING:
                return existing
            replica = Replica(replica_id, str(spec["name"]), sum(int(f["size"]) for f in spec["files"]))
            self._replicas[replica_id] = replica
        threading.Thread(target=self._copy, args=(replica, spec), daemon=True).start()
        return replica

    def _copy(self, replica: Replica, spec: dict[str, Any]) -> None:
        incoming = self.models_dir / ".incoming" / replica.replica_id
        try:
            incoming.mkdir(parents=True, exist_ok=True)
            for item in spec["files"]:
                self._fetch(replica, spec["base_url"], item, incoming)
            self._place(replica, spec, incoming)
            replica.finished_at = time.time()
            replica.state = PRESENT
            logger.info("replica %s (%s) is present", replica.replica_id, replica.name)
        except Exception as exc:
            replica.finished_at = time.time()
            replica.state, replica.reason = FAILED, str(exc)[:500]
            logger.warning("replica %s failed: %s", replica.replica_id, replica.reason)

    def _fetch(self, replica: Replica, base_url: str, item: dict[str, Any], incoming: Path) -> None:
        relative = Path(item["path"])
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"refusing the file name {item['path']!r}")
        destination = incoming / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".part")
        size = int(item["size"])
        have = partial.stat().st_size if partial.exists() else 0
        if have > size:  # not a prefix of this file: start over
            partial.unlink()
            have = 0
        check = verification(item)
        if check is None:  # refused at the door (agent.server); kept here so no path copies unverified
            raise RuntimeError(f"{item['path']}: the artifact's record has no digest this agent can verify")
        hasher = check.new()
        if have:  # resuming: what is already on disk is part of the digest
            with partial.open("rb") as reader:
                for block in iter(lambda: reader.read(CHUNK), b""):
                    hasher.update(block)
            replica.done += have
        if have < size:
            hasher = self._receive(replica, base_url, item, partial, have, check, hasher)
        # have == size: an agent that died after the last byte and before the rename; a Range from the
        # end would be refused (416) on every retry, so what is on disk is verified as it stands.
        if hasher.hexdigest() != check.expected:
            partial.unlink()
            raise RuntimeError(
                f"{item['path']}: {check.name} does not match the artifact's record; discarded"
            )
        partial.rename(destination)

    def _receive(
        self,
        replica: Replica,
        base_url: str,
        item: dict[str, Any],
        partial: Path,
        have: int,
        check: Verification,
        hasher: Any,
    ) -> Any:
        """The rest of the file from byte ``have`` into ``partial``, hashed as it arrives; returns the
        hasher (a new one when the server sent the file whole)."""
        headers = {"Authorization": f"Bearer {self.credential}"}
        if have:
            headers["Range"] = f"bytes={have}-"
        url = f"{self.control_plane_url}{base_url.rstrip('/')}/{quote(item['path'])}"
        response = transfer.open_get(url, headers, timeout=60.0)
        try:
            if response.status not in (200, 206):
                raise RuntimeError(f"GET {item['path']} answered {response.status}")
            if response.status == 200 and have:
                hasher = check.new()  # the server sent it whole: start over
                replica.done -= have
            resume_at = have if response.status == 206 else 0
            writer = BlockWriter(partial, resume_at, int(item["size"]))
            try:

                def write(block: memoryview) -> None:
                    writer.write(block)
                    replica.done += len(block)

                # Hashed as it arrives (one pass over the bytes), beside the write: each on a thread of
                # its own while the next block is received (hashlib and file writes release the GIL).
                response.pipe(hasher.update, write)
            finally:
                writer.close()
        finally:
            response.close()
        return hasher

    def _place(self, replica: Replica, spec: dict[str, Any], incoming: Path) -> None:
        """Move the verified files where the presence check looks: a single .gguf file directly, anything
        else as a folder named after the artifact."""
        files = spec["files"]
        if len(files) == 1 and files[0]["path"].endswith(".gguf") and replica.name.endswith(".gguf"):
            (incoming / files[0]["path"]).replace(self.models_dir / replica.name)
            shutil.rmtree(incoming, ignore_errors=True)
            return
        target = self.models_dir / replica.name
        if target.exists():
            shutil.rmtree(target)
        incoming.replace(target)
