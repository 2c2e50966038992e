"""What one ``make run`` started, found by a mark in its environment, and stopped however the run ends.

``make run`` starts every process with ``MODELFORGE_RUN_MARK=<run>:<role>``, and what those start inherits
it: gunicorn's workers, celery's pool, the agent's model servers in sessions of their own. Two things use
the mark:

1. The guardian (``python -m modelforge.devguard``), which the run starts in a session of its own, reads
   a pipe only the run holds open. End of file means the run is gone, however it went (kill -9, the
   out-of-memory killer, a closed terminal), and the guardian stops every process that carries the
   run's mark: SIGTERM, then SIGKILL after ``GRACE`` seconds.
2. The next run on the data folder reads the last run's mark from ``<home>/run.mark`` and stops what still
   carries it (left when the guardian died with its run), naming what it stopped.

A mark is 128 random bits, so a process that took a dead one's pid never carries it. Linux only (``/proc``);
elsewhere nothing is found.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MARK = "MODELFORGE_RUN_MARK"
# SIGTERM first (the agent stops its model servers, celery its pool), SIGKILL for what is left after this
# many seconds: a killed run's processes are gone within 5 s.
GRACE = 2.0


def new_mark() -> str:
    return secrets.token_hex(16)


def with_role(env: dict[str, str], role: str) -> dict[str, str]:
    """``env`` with its run's mark naming ``role`` (unchanged when it carries no mark)."""
    if MARK not in env:
        return env
    return {**env, MARK: f"{env[MARK].split(':', 1)[0]}:{role}"}


def _mark_file(home: Path) -> Path:
    return home / "run.mark"


def last_mark(home: Path) -> str | None:
    try:
        return _mark_file(home).read_text().strip() or None
    except OSError:
        return None


def record_mark(home: Path, mark: str) -> None:
    _mark_file(home).write_text(mark + "\n")


def _stat(pid: int) -> tuple[str, int]:
    """``(state, session id)`` from ``/proc/<pid>/stat``; the command name may hold spaces and parentheses."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[3])


def _role(pid: int, prefix: bytes) -> str | None:
    """The role in ``pid``'s mark when it carries this run's mark, else None."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return None
    # Index i of b"\0" + environ is where the variable starts in environ: each one follows a NUL.
    start = (b"\0" + environ).find(b"\0" + prefix)
    if start < 0:
        return None
    end = environ.find(b"\0", start)
    role = environ[start + len(prefix) : end if end >= 0 else None].decode(errors="replace")
    if role == "agent" and not _is_agent(pid):
        return "model server"  # what the agent started carries its mark
    return role


def _pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                yield int(entry)


def marked(run: str) -> dict[int, str]:
    """``{pid: role}`` of every live process that carries ``run``'s mark.

    A process that rewrote its environment (a process title set over it) is still found when it runs in
    a session one of the marked processes leads: only the run's processes can be in such a session.
    """
    prefix = f"{MARK}={run}:".encode()
    found: dict[int, str] = {}
    sessions: dict[int, int] = {}
    for pid in _pids():
        try:
            state, session = _stat(pid)
        except (OSError, IndexError, ValueError):
            continue
        if state == "Z":  # dead, waiting to be reaped: nothing to stop
            continue
        sessions[pid] = session
        role = _role(pid, prefix)
        if role is not None:
            found[pid] = role
    leaders = {pid: role for pid, role in found.items() if sessions.get(pid) == pid}
    for pid, session in sessions.items():
        if pid not in found and session in leaders:
            found[pid] = leaders[session]
    return found


def _signal_each(pids: dict[int, str], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def stop(run: str, grace: float = GRACE) -> dict[int, str]:
    """Stop every process of ``run`` (SIGTERM, then SIGKILL after ``grace`` s); ``{pid: role}`` of those."""
    found = marked(run)
    if not found:
        return {}
    _signal_each(found, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = found
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked(run)
        found.update(left)
    # Until none is left: one may have started another meanwhile (a gunicorn master its next worker).
    for _ in range(100):
        if not left:
            break
        _signal_each(left, signal.SIGKILL)
        time.sleep(0.05)
        left = marked(run)
        found.update(left)
    return found


def describe(found: dict[int, str]) -> str:
    """``web (pid 11, 12), worker (pid 13), agent (pid 14), model server (pid 15)``."""
    named: dict[str, list[int]] = {}
    for pid, role in sorted(found.items()):
        named.setdefault(role, []).append(pid)
    return ", ".join(f"{role} (pid {', '.join(map(str, pids))})" for role, pids in named.items())


def _is_agent(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    return argv[1:3] == [b"-m", b"agent"]


class Guardian:
    """The run's side of the guardian: the pipe's write end, held by the run and by nothing else."""

    def __init__(self, run: str) -> None:
        read_end, self.write_end = os.pipe()  # neither end is inherited by what the run starts later
        self.process = subprocess.Popen(
            [sys.executable, "-m", "modelforge.devguard", run, str(os.getpid())],
            cwd=Path(__file__).resolve().parent.parent,
            stdin=read_end,
            # Out of the terminal's session: a closed terminal or a kill of make run's group spares it.
            start_new_session=True,
        )
        os.close(read_end)

    def close(self, wait: float = GRACE + 3) -> None:
        """The run ends cleanly: the guardian stops whatever was still left, then exits."""
        if self.write_end < 0:
            return
        os.close(self.write_end)
        self.write_end = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait)


def guard(run: str, supervisor: int) -> int:
    """Wait for the end of ``supervisor`` (the pipe on stdin), then stop what carries ``run``'s mark."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while sys.stdin.buffer.read(1):
        pass
    found = stop(run)
    if found:
        # Best effort: the terminal of a killed run may be gone.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(
                f"modelforge: the make run (pid {supervisor}) ended without stopping its processes; "
                f"stopped {describe(found)}\n"
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(guard(sys.argv[1], int(sys.argv[2])))
