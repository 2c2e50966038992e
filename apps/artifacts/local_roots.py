"""Which local paths the control plane may read as an artifact source.

A local source is read by the worker and then served to every node, so what it may read is bounded:

1. the locator is an absolute path, resolved (every link followed) before it is judged;
2. it is not ModelForge's own data, whatever the roots say: not the data folder itself or a folder that
   holds it, not the secrets folder, the artifact store, the backup root, the agent's state, a file named
   by a ``MODELFORGE_*_FILE`` variable or the kernel's ``/proc``, ``/sys`` and ``/dev``, nor inside or
   around any of them;
3. it lies under one of ``MODELFORGE_ARTIFACT_LOCAL_ROOTS`` (a root that is not absolute or that holds the
   secrets folder is a start-up problem and is never used);
4. while acquiring, every entry of the tree is judged the same way once its links are resolved, and the
   whole tree before a byte is copied; a file is then opened without following links and must still be
   the file that was judged.

Each refusal is ``LocalSourceRefused``, whose message says what was refused and what to do.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

from agent.settings import DEFAULT_STATE_VOLUME, STATE_VOLUME

SETTING = "MODELFORGE_ARTIFACT_LOCAL_ROOTS"
NEVER = f"it is never read as an artifact source, whatever {SETTING} says"


class LocalSourceRefused(Exception):
    """A local path the control plane may not read; the message says why and what to do."""


@dataclass(frozen=True)
class LocalFile:
    """One file of a local source: its path in the artifact (a link's own name) and the file it reads."""

    relative: str
    real: Path
    device: int
    inode: int


def _resolve(path: Path) -> Path | None:
    """Every link followed, ``..`` applied; None when it cannot be (a link loop, a NUL character)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _secrets_folder() -> Path:
    return Path(settings.MODELFORGE_HOME) / "secrets"


def _secret_files() -> list[tuple[str, Path]]:
    # Read from the process's environment at the time of the check: these variables are what the
    # settings (and a co-located agent) were read from, including ones this module does not know by name.
    return [
        (f"the secret file named by {name}", Path(value))
        for name, value in sorted(os.environ.items())
        if name.startswith("MODELFORGE_") and name.endswith("_FILE") and value
    ]


def _protected() -> list[tuple[str, Path, bool]]:
    """(what, resolved folder or file, whether what lies inside it is refused too). The data folder's
    other contents are reachable only through a root inside it: no usable root holds the data folder."""
    home = Path(settings.MODELFORGE_HOME)
    named: list[tuple[str, Path, bool]] = [
        ("the data folder (MODELFORGE_HOME)", home, False),
        ("the secrets folder", _secrets_folder(), True),
        ("the artifact store (MODELFORGE_ARTIFACT_STORE)", Path(settings.ARTIFACT_STORE), True),
        ("the backup root (MODELFORGE_BACKUP_ROOT)", Path(settings.BACKUP_ROOT), True),
        ("the agent's state (make run's local agent)", home / "agent", True),
        (
            f"the agent's state ({STATE_VOLUME})",
            Path(os.environ.get(STATE_VOLUME) or DEFAULT_STATE_VOLUME),
            True,
        ),
        *((what, path, True) for what, path in _secret_files()),
        # The kernel's views of processes and devices: /proc/self/environ holds this process's secrets.
        *((f"the kernel's {name} folder", Path(name), True) for name in ("/proc", "/sys", "/dev")),
    ]
    # A relative setting is resolved from this process's directory, as the process itself uses it.
    resolved = [(what, _resolve(path), inside) for what, path, inside in named]
    return [(what, path, inside) for what, path, inside in resolved if path is not None]


def roots() -> list[Path]:
    """The usable roots, resolved: absolute, and not holding (or inside) the secrets folder."""
    secrets = _resolve(_secrets_folder())
    usable: list[Path] = []
    for root in settings.ARTIFACT_LOCAL_ROOTS:
        real = _resolve(Path(root)) if Path(root).is_absolute() else None
        if real is None or secrets is None or _within(real, secrets) or _within(secrets, real):
            continue  # reported at start-up as INVALID_SETTING; never used
        usable.append(real)
    return usable


def _judge(
    where: str, real: Path, usable: list[Path], protected: list[tuple[str, Path, bool]] | None = None
) -> None:
    """Refuse ``real`` (``where`` names it for the message) unless it lies under a usable root and clear
    of ModelForge's own data."""
    for what, area, inside_too in _protected() if protected is None else protected:
        if real == area:
            raise LocalSourceRefused(f"{where} is {what}; {NEVER}.")
        if area in real.parents and inside_too:
            raise LocalSourceRefused(f"{where} is inside {what} ({area}); {NEVER}.")
        if real in area.parents:
            raise LocalSourceRefused(
                f"{where} contains {what} ({area}); {NEVER}. Name the folder that holds the weights."
            )
    if not usable:
        raise LocalSourceRefused(
            f"No local source may be read here: {SETTING} is empty or names no usable folder. Set it, on the "
            "web process and the worker, to the folders weights may be read from, or register an http or "
            "huggingface source."
        )
    if not any(_within(real, root) for root in usable):
        raise LocalSourceRefused(
            f"{where} is not under {SETTING} ({', '.join(map(str, usable))}). Put the weights under one of "
            "those folders, or add their folder to the setting on the web process and the worker."
        )


def admit(locator: str) -> Path:
    """The resolved path of a local source the control plane may read, or ``LocalSourceRefused``."""
    if not os.path.isabs(locator):
        raise LocalSourceRefused(
            f"A local source is an absolute path on the worker's file system; {locator!r} is not one "
            "(nor is a file:// URL)."
        )
    real = _resolve(Path(locator))
    if real is None:
        raise LocalSourceRefused(f"{locator!r} cannot be resolved (a link loop, or not a path).")
    _judge(locator if str(real) == locator else f"{locator} (resolved: {real})", real, roots())
    return real


def _secret_inodes() -> dict[tuple[int, int], Path]:
    """The files that hold secrets, by device and inode: a hard link is the same file under another name,
    which no path check can see."""
    candidates = [path for _, path in _secret_files()]
    secrets = _secrets_folder()
    if secrets.is_dir():
        candidates += [p for p in secrets.rglob("*") if not p.is_symlink()]
    home = Path(settings.MODELFORGE_HOME)
    state = Path(os.environ.get(STATE_VOLUME) or DEFAULT_STATE_VOLUME)
    candidates += [home / "agent" / "volume" / "identity.json", state / "identity.json"]
    found: dict[tuple[int, int], Path] = {}
    for path in candidates:
        try:
            info = path.stat()
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(info.st_mode):
            found[(info.st_dev, info.st_ino)] = path
    return found


def walk(locator: str) -> list[LocalFile]:
    """Every file of a local source (a file, or a folder's tree in name order), each link resolved and
    judged like the locator itself, the whole tree before anything is read. ``LocalSourceRefused`` for a
    path that may not be read; ``OSError`` for one that cannot be (missing, a broken link, a link loop)."""
    source = admit(locator)
    usable, protected = roots(), _protected()
    secrets = _secret_inodes()
    found: list[LocalFile] = []
    first = "" if source.is_dir() else Path(os.path.normpath(locator)).name
    # (its path in the artifact, the resolved path to read, the resolved folders above it); depth first.
    pending: list[tuple[str, Path, frozenset[Path]]] = [(first, source, frozenset())]
    while pending:
        relative, real, above = pending.pop()
        info = os.lstat(real)  # resolved: its last component is not a link
        secret = secrets.get((info.st_dev, info.st_ino))
        if secret is not None:
            raise LocalSourceRefused(f"{relative} is the same file as {secret} (a hard link); {NEVER}.")
        if stat.S_ISREG(info.st_mode):
            found.append(LocalFile(relative, real, info.st_dev, info.st_ino))
        if not stat.S_ISDIR(info.st_mode):
            continue  # sockets, pipes and devices are not weights, and reading a pipe would block
        descriptor = _open_nofollow(real, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with os.scandir(descriptor) as scan:
                entries = sorted((entry.name, entry.is_symlink()) for entry in scan)
        finally:
            os.close(descriptor)
        children = []
        for name, is_link in entries:
            child_relative = f"{relative}/{name}" if relative else name
            child = real / name
            if is_link:
                resolved = _resolve(child)
                if resolved is None:
                    raise OSError(errno.ELOOP, "a link that cannot be resolved", child_relative)
                _judge(f"{child_relative} in {locator}, a link to {resolved},", resolved, usable, protected)
                if resolved in above or resolved == real:
                    raise OSError(errno.ELOOP, "a link back to a folder that holds it", child_relative)
                if not os.path.lexists(resolved):
                    raise OSError(errno.ENOENT, f"a link to {resolved}, which does not exist", child_relative)
                child = resolved
            children.append((child_relative, child, above | {real}))
        pending.extend(reversed(children))
    return found


def _open_nofollow(real: Path, flags: int) -> int:
    """Open a resolved path one component at a time, refusing a link anywhere in it: only the path that
    was judged is read, even when a link has been swapped in since (``LocalSourceRefused``)."""
    *folders, last = real.parts[1:] or ["."]
    folder = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in folders:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(last, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LocalSourceRefused(f"{real} changed after it was checked; nothing is kept.") from exc
        raise
    finally:
        os.close(folder)


def open_checked(item: LocalFile) -> BinaryIO:
    """Open the judged file, through no link, and only if it is still the file that was judged."""
    # Non-blocking: a pipe swapped in for the file must not hang the worker before it is told apart.
    descriptor = _open_nofollow(item.real, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(descriptor)
    if (info.st_dev, info.st_ino) != (item.device, item.inode) or not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        raise LocalSourceRefused(f"{item.relative} was replaced after it was checked; nothing is kept.")
    return os.fdopen(descriptor, "rb")
