"""``make run`` and ``make test``: the whole platform on the embedded default, from one command.

    python -m modelforge.devstack run     # services, migrate, operator login, web + worker + beat
    python -m modelforge.devstack test    # throw-away services, then lint, checks and pytest
    python -m modelforge.devstack up|down # only the embedded services (for manage.py by hand)

PostgreSQL and Redis come from PyPI wheels (``modelforge.embedded``) unless ``MODELFORGE_DATABASE_URL``
/ ``MODELFORGE_REDIS_URL`` are set. A process that exits is started again after a back-off; one that
keeps crashing, a refused start (status 3), Ctrl-C or SIGTERM stops every process this started, services
last. A run killed outright leaves none of its processes running: its guardian stops them
(``modelforge.devguard``), or else the next run on the data folder does.
"""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":

    def _interrupted_while_importing(signum: int, frame: object) -> None:
        # Ctrl-C in the first moments of `make run`, while the modules below still import: nothing has been
        # started, so stop with the same words as later rather than a traceback from inside an import.
        sys.stdout.write("modelforge: interrupted\nmodelforge: stopped\n")
        sys.stdout.flush()
        raise SystemExit(0)

    signal.signal(signal.SIGINT, _interrupted_while_importing)

import contextlib
import datetime
import fcntl
import http.client
import os
import re
import secrets
import socket
import subprocess
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from modelforge import devguard
from modelforge.embedded import EmbeddedStack, EmbeddedStackError, port_defaults

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


# Our lines and the copied output of every process go out whole, one at a time.
_OUTPUT = threading.Lock()


def _write_line(line: str) -> None:
    with _OUTPUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def say(message: str) -> None:
    _write_line(f"modelforge: {message}")


def _secret_file(path: Path, length: int) -> str:
    """A random secret kept in a 0600 file under MODELFORGE_HOME, made on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(length))
    return path.read_text().strip()


class Interrupted(Exception):
    """Ctrl-C or SIGTERM came while a set-up step ran: stop what was started and say so."""


# Set by make run's SIGINT/SIGTERM handler: the loop and every set-up step look at it.
INTERRUPTED = threading.Event()


def _manage(env: dict[str, str], *args: str) -> None:
    """``manage.py`` as a set-up step: in a session of its own, so the terminal's Ctrl-C reaches only us
    (a migrate that got it printed a traceback), and stopped by us when Ctrl-C comes."""
    argv = [PYTHON, "manage.py", *args]
    process = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    while True:
        try:
            code = process.wait(0.2)
        except subprocess.TimeoutExpired:
            if INTERRUPTED.is_set():
                _signal_group(process.pid, signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    _signal_group(process.pid, signal.SIGKILL)
                    process.wait()
                raise Interrupted from None
            continue
        if code != 0 and INTERRUPTED.is_set():
            # Ctrl-C between the fork and the child's new session reaches the child too: not a failure.
            raise Interrupted
        if code != 0:
            raise subprocess.CalledProcessError(code, argv)
        return


def _check_interrupted() -> None:
    if INTERRUPTED.is_set():
        raise Interrupted


class DataFolderLock:
    """One ``make run`` per data folder: an exclusive ``flock`` on ``<home>/run.lock``, held while it runs.

    The kernel drops the lock when its holder dies, however it dies, so a killed run never leaves the
    folder locked. The file says who holds it (pid, start time) for the refusal of the next run.
    """

    def __init__(self, home: Path) -> None:
        self.path = home / "run.lock"
        self.fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock; ``None`` when taken, else what the file says of its holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "a process that has not said"
            os.close(fd)
            return holder
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {started}\n".encode(), 0)
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing drops the lock
            self.fd = None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 -- our own loopback URL
            return bool(response.status == 200)
    except (OSError, http.client.HTTPException):  # URLError, a reset or a timeout: not answering yet
        return False


# A process that exits with this status refused its configuration (start-up validation, the database
# check, the agent's refusals): started again, it would only print the same refusal.
EXIT_REFUSED = 3
# How many of a process's last output lines are quoted when it keeps crashing.
LAST_LINES = 15


def describe_status(code: int) -> str:
    """``status 1``, or ``status -9 (SIGKILL)`` for a process killed by a signal."""
    if code < 0:
        try:
            return f"status {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"status {code}"


def _signal_group(pgid: int, signum: int) -> bool:
    """Signal every process left in a group; False when none was left."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _children_of(parent: int) -> list[tuple[int, str]]:
    """``(pid, state)`` of every process whose parent is ``parent`` (Linux ``/proc``; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            # The command name in parentheses may hold spaces: the fields that follow are read after it.
            state, ppid = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if int(ppid) == parent:
            found.append((int(entry), state))
    return found


@dataclass
class Ending:
    """Why the supervision loop stops everything: the lines to say and the status ``make run`` exits with."""

    lines: list[str]
    code: int


@dataclass(eq=False)
class Child:
    """One supervised process: how to start it again, its latest output, and when it crashed."""

    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    output: deque[str] = field(default_factory=lambda: deque(maxlen=LAST_LINES))
    crashes: deque[float] = field(default_factory=deque)
    restart_at: float | None = None  # set while a crashed process waits out its back-off
    leftovers: bool = False  # its group outlived it (gunicorn's workers, celery's pool)
    reader: threading.Thread | None = None  # copies its output


class Supervisor:
    """Runs the platform's processes, each in its own session so only we receive Ctrl-C, and starts one
    that exits again.

    1. A process that exits is a crash: what it left in its process group is sent SIGTERM (a web worker
       left behind would hold the port the new master binds), and the process is started again after
       ``first_delay`` seconds, doubled for each crash inside ``window`` (1, 2, 4, 8 s), at most
       ``max_delay``; the group's leftovers are killed just before.
    2. The ``crash_limit``-th crash inside ``window`` ends the run, quoting the process's last lines;
       so does status 3, a refused start, at once: started again it would only refuse again.
    3. Nothing here stops the embedded services: ``run()`` stops them after ``stop_all``, and only at a
       real shutdown (Ctrl-C, SIGTERM or an ending), never because one process crashed.
    """

    def __init__(
        self,
        env: dict[str, str],
        *,
        first_delay: float = 1,
        max_delay: float = 30,
        crash_limit: int = 5,
        window: float = 120,
    ) -> None:
        self.env = env
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.crash_limit = crash_limit
        self.window = window
        self.children: dict[str, Child] = {}
        self.stopping = False
        self.adopting = False
        self.guardian: int | None = None  # our child, not an orphan: it outlives us on purpose

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        env = devguard.with_role(env or self.env, name)
        child = Child(name, argv, env, self._spawn(argv, env))
        self.children[name] = child
        self._follow(child)

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _follow(self, child: Child) -> None:
        """Copy the process's output to ours, line by line, keeping its last lines to quote."""
        process = child.process

        def copy() -> None:
            assert process.stdout is not None
            with process.stdout:
                for raw in process.stdout:
                    line = raw.decode(errors="replace").rstrip("\r\n")
                    child.output.append(line)
                    # Drained even when our own output is gone: a full pipe would stall the process.
                    with contextlib.suppress(OSError, ValueError):
                        _write_line(line)

        child.reader = threading.Thread(target=copy, name=f"output of {child.name}", daemon=True)
        child.reader.start()

    def adopt_orphans(self) -> None:
        """Become the parent of our children's orphans (Linux ``PR_SET_CHILD_SUBREAPER``).

        The agent starts each model server in a session of its own, so a server outlives an agent that
        crashed; without this it would pass to init and outlive ``make run`` too. Call it after the
        embedded services have started: they daemonize, and must not become ours.
        """
        if not sys.platform.startswith("linux"):
            return
        import ctypes

        pr_set_child_subreaper = 36
        libc = ctypes.CDLL(None, use_errno=True)
        self.adopting = libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0

    @contextlib.contextmanager
    def not_adopting(self) -> Iterator[None]:
        """Start something that daemonizes (an embedded service started again) without adopting it."""
        if not self.adopting:
            yield
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 0, 0, 0, 0)
        try:
            yield
        finally:
            libc.prctl(36, 1, 0, 0, 0)

    def check(self) -> Ending | None:
        """One turn of the loop: start again what has waited out its back-off, note what exited."""
        now = time.monotonic()
        for child in self.children.values():
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child)
                continue
            code = child.process.poll()
            if code is not None:
                ending = self._exited(child, code, now)
                if ending is not None:
                    return ending
        self._orphans()  # reaps the adopted ones that exited
        return None

    def _exited(self, child: Child, code: int, now: float) -> Ending | None:
        child.leftovers = _signal_group(child.process.pid, signal.SIGTERM)
        if code == EXIT_REFUSED:
            self._last_lines_copied(child)
            return Ending([f"the {child.name} process exited with status {code}; stopping everything"], code)
        while child.crashes and child.crashes[0] <= now - self.window:
            child.crashes.popleft()
        child.crashes.append(now)
        count = len(child.crashes)
        window = f"{self.window:g} s"
        if count >= self.crash_limit:
            self._last_lines_copied(child)
            return Ending(
                [
                    f"the {child.name} process crashed {count} times within {window} "
                    f"(last: {describe_status(code)}); stopping everything. Its last lines:",
                    *(f"    {line}" for line in child.output),
                ],
                1,
            )
        delay = min(self.max_delay, self.first_delay * 2 ** (count - 1))
        child.restart_at = now + delay
        say(
            f"the {child.name} process exited with {describe_status(code)}; restarting it in {delay:g} s "
            f"(crash {count} of {self.crash_limit} within {window})"
        )
        return None

    @staticmethod
    def _last_lines_copied(child: Child) -> None:
        """Wait (briefly: leftovers in its group may hold the pipe) until the process's last lines are
        out, so that they come before the line that ends the run."""
        if child.reader is not None:
            child.reader.join(2)

    def _restart(self, child: Child) -> None:
        if child.leftovers:  # what ignored the SIGTERM during the back-off
            _signal_group(child.process.pid, signal.SIGKILL)
        child.restart_at, child.leftovers = None, False
        child.process = self._spawn(child.argv, child.env)
        self._follow(child)
        say(f"restarted the {child.name} process (pid {child.process.pid})")

    def _orphans(self) -> list[int]:
        """The live processes we adopted (see ``adopt_orphans``); the dead ones are reaped here. Never
        looked at unless adopting: another parent's zombie is not ours to reap."""
        if not self.adopting:
            return []
        ours = {child.process.pid for child in self.children.values()} | {self.guardian}
        live = []
        for pid, state in _children_of(os.getpid()):
            if pid in ours:
                continue
            if state == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            else:
                live.append(pid)
        return live

    def stop_all(self, grace: float = 15) -> None:
        """SIGTERM every process and wait ``grace`` seconds, then SIGKILL its group; then stop what crashed
        processes left running (a killed agent's model servers), so nothing outlives the embedded services."""
        running = [child for child in self.children.values() if child.process.poll() is None]
        for child in running:
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in running:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child.process.pid, signal.SIGKILL)
                child.process.wait()
        for child in self.children.values():
            if child in running or child.leftovers:
                _signal_group(child.process.pid, signal.SIGKILL)
        orphans = self._orphans()
        if not orphans:
            return
        say(f"stopping what crashed processes left running: pid {', '.join(map(str, orphans))}")
        for pid in orphans:
            _stop_process(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while orphans and time.monotonic() < deadline:
            time.sleep(0.2)
            orphans = self._orphans()
        for pid in orphans:
            _stop_process(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self._orphans() and time.monotonic() < deadline:
            time.sleep(0.1)


class ServiceWatch:
    """The embedded services, watched the way the Supervisor watches its processes.

    A service found gone (its PostgreSQL or Redis killed) is started again after the Supervisor's
    back-off (``first_delay``, doubled per loss inside ``window``); the ``crash_limit``-th loss inside
    ``window`` ends the run. Without this, a lost database left ``/healthz`` ok and every request a 500.
    """

    def __init__(self, stack: EmbeddedStack, supervisor: Supervisor) -> None:
        self.stack = stack
        self.supervisor = supervisor
        self.losses: dict[str, deque[float]] = {}
        self.restart_at: dict[str, float] = {}

    def check(self) -> Ending | None:
        now = time.monotonic()
        sup = self.supervisor
        window = f"{sup.window:g} s"
        for name, pid in self.stack.gone().items():
            if name in self.restart_at:
                if now < self.restart_at[name]:
                    continue
                del self.restart_at[name]
                try:
                    with sup.not_adopting():
                        self.stack.restart(name)
                except (EmbeddedStackError, subprocess.CalledProcessError, OSError) as exc:
                    say(f"the embedded {name} did not start again: {exc}")
                else:
                    say(f"restarted the embedded {name} (pid {self.stack.last_pids.get(name)})")
                    continue
            losses = self.losses.setdefault(name, deque())
            while losses and losses[0] <= now - sup.window:
                losses.popleft()
            losses.append(now)
            count = len(losses)
            if count >= sup.crash_limit:
                return Ending(
                    [
                        f"the embedded {name} stopped {count} times within {window}; stopping everything. "
                        f"Its log: {self._log(name)}"
                    ],
                    1,
                )
            delay = min(sup.max_delay, sup.first_delay * 2 ** (count - 1))
            self.restart_at[name] = now + delay
            say(
                f"the embedded {name} (pid {pid}) is gone; restarting it in {delay:g} s "
                f"(loss {count} of {sup.crash_limit} within {window})"
            )
        return None

    def _log(self, name: str) -> Path | None:
        service = self.stack.service(name)
        return service.log_file if service is not None else None


def _stop_process(pid: int, signum: int) -> None:
    """Signal ``pid`` with its whole group when it leads one (a model server and the workers it spawned)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)


def _base_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["MODELFORGE_HOME"] = str(home)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _home() -> Path:
    return Path(os.environ.get("MODELFORGE_HOME") or ROOT / ".modelforge").resolve()


def _refuse_in_use(home: Path, holder: str) -> int:
    say(
        f"[DATA_FOLDER_IN_USE] the data folder {home} is in use by another make run ({holder}). Stop that "
        "one first (Ctrl-C in its terminal), or give this one a folder and a port of its own: "
        "MODELFORGE_HOME=... MODELFORGE_PORT=..."
    )
    return EXIT_REFUSED


def run() -> int:
    """``make run``: Ctrl-C (or SIGTERM) at any moment stops what this run started and says so."""
    INTERRUPTED.clear()

    def _stop(signum: int, frame: object) -> None:
        INTERRUPTED.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    home = _home()
    lock = DataFolderLock(home)
    holder = lock.acquire()
    if holder is not None:
        return _refuse_in_use(home, holder)
    try:
        return _run_locked(home)
    finally:
        lock.release()


def _run_locked(home: Path) -> int:
    env = _base_env(home)
    if not (env.get("MODELFORGE_SECRET_KEY") or env.get("MODELFORGE_SECRET_KEY_FILE")):
        env["MODELFORGE_SECRET_KEY"] = _secret_file(home / "secrets" / "secret-key", 48)
    if not (env.get("MODELFORGE_OPERATOR_API_KEY") or env.get("MODELFORGE_OPERATOR_API_KEY_FILE")):
        env["MODELFORGE_OPERATOR_API_KEY"] = _secret_file(home / "secrets" / "operator-api-key", 32)
    if not (env.get("MODELFORGE_CLUSTER_SECRET") or env.get("MODELFORGE_CLUSTER_SECRET_FILE")):
        env["MODELFORGE_CLUSTER_SECRET"] = _secret_file(home / "secrets" / "cluster-secret", 32)
    # The local node (co-located with the control plane) runs the local agent; local-node-only servers
    # (GGUF, encrypted weights) may run there and nowhere else.
    local_name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:63].strip("-.") or "local"
    env.setdefault("MODELFORGE_AGENT_NAME", local_name)
    env.setdefault("MODELFORGE_LOCAL_NODE", env["MODELFORGE_AGENT_NAME"])
    # A cutover's reindex embeds through this stack's own gateway.
    env.setdefault("MODELFORGE_GATEWAY_URL", f"http://127.0.0.1:{env.get('MODELFORGE_PORT', '8000')}")

    say(f"data folder {home}")
    _stop_what_a_dead_run_left(home)
    # Every process this run starts carries the mark, and what they start inherits it: the guardian and
    # the next run find them by it (modelforge.devguard).
    mark = devguard.new_mark()
    devguard.record_mark(home, mark)
    env[devguard.MARK] = f"{mark}:set-up"
    # The backup root of the embedded default (a configured MODELFORGE_BACKUP_ROOT is the operator's to
    # provide: a missing one is refused as DESTINATION_UNAVAILABLE, never created behind their back).
    if not env.get("MODELFORGE_BACKUP_ROOT"):
        (home / "backups").mkdir(parents=True, exist_ok=True)
    # Local artifact sources are read only under a root (empty: none). make run's is <home>/imports, a
    # folder of its own: the data folder itself holds the secrets, the store and the databases.
    if "MODELFORGE_ARTIFACT_LOCAL_ROOTS" not in env:
        env["MODELFORGE_ARTIFACT_LOCAL_ROOTS"] = str(home / "imports")
        (home / "imports").mkdir(parents=True, exist_ok=True)
    try:
        stack = EmbeddedStack.from_environment(home, env)
    except EmbeddedStackError as exc:
        say(str(exc))
        return EXIT_REFUSED
    supervisor = Supervisor(env)
    guardian = devguard.Guardian(mark)
    supervisor.guardian = guardian.process.pid
    code = 0
    try:
        try:
            # The services start in sessions of their own, out of the terminal's Ctrl-C: one that came
            # meanwhile is acted on as soon as they are up (a half-started PostgreSQL is not stopped).
            env.update(stack.start())
        except (EmbeddedStackError, subprocess.CalledProcessError) as exc:
            say(f"could not start the embedded services: {exc}")
            return 1
        for name in stack.found_running():
            say(
                f"the embedded {name} of this data folder was running already (left by a run that was "
                "killed?): using it, and leaving it running at the end (make services-down stops it)"
            )
        supervisor.adopt_orphans()
        code = _serve(env, home, stack, supervisor)
    except Interrupted:
        pass
    except subprocess.CalledProcessError as exc:
        say(f"a set-up step failed ({' '.join(map(str, exc.cmd[1:]))}: status {exc.returncode})")
        code = exc.returncode or 1
    finally:
        if INTERRUPTED.is_set():
            say("interrupted")
        say("stopping")
        supervisor.stop_all()
        stack.stop(only_started=True)
        guardian.close()
        say("stopped")
    return code


def _stop_what_a_dead_run_left(home: Path) -> None:
    """Stop the processes of the last run on ``home`` that still run (its guardian died with it)."""
    mark = devguard.last_mark(home)
    if mark is None:
        return
    found = devguard.stop(mark)
    if found:
        say(
            "stopped what the last run on this data folder left running (it was killed): "
            f"{devguard.describe(found)}"
        )


def _serve(env: dict[str, str], home: Path, stack: EmbeddedStack, supervisor: Supervisor) -> int:
    """Migrate, start web + worker + beat, then the local agent and the demo once the web answers; watch
    every process and the embedded services until Ctrl-C or an ending."""
    _check_interrupted()
    say("migrating the database")
    _manage(env, "migrate", "--noinput")
    if env.get("MODELFORGE_OBSERVABILITY_DATABASE_URL"):  # monitoring history in a database of its own
        _manage(env, "migrate", "--database", "observability", "--noinput")
    _manage(env, "ensure_operator", "--credentials-file", str(home / "secrets" / "operator-login"))
    _check_interrupted()
    host = env.get("MODELFORGE_HOST", "127.0.0.1")
    port = env.get("MODELFORGE_PORT", "8000")
    supervisor.start(
        "web",
        [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
    )
    supervisor.start(
        "worker",
        [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "modelforge",
            "worker",
            "-l",
            "INFO",
            "--concurrency",
            env.get("MODELFORGE_WORKER_CONCURRENCY", "2"),
            "--hostname",
            "worker@%h",
        ],
    )
    supervisor.start("beat", [PYTHON, "-m", "celery", "-A", "modelforge", "beat", "-l", "INFO"])
    url = f"http://{host}:{port}/"
    local_agent = _flag(env, "MODELFORGE_LOCAL_AGENT")
    watch = ServiceWatch(stack, supervisor)
    healthy = False
    next_probe = next_watch = 0.0
    while not INTERRUPTED.is_set():
        ending = supervisor.check()
        if ending is None and time.monotonic() >= next_watch:
            next_watch = time.monotonic() + 1
            ending = watch.check()
        if ending is not None:
            for line in ending.lines:
                say(line)
            return ending.code
        # The agent enrolls through the web process, so it starts once that answers (a web process
        # that crashed while starting is started again by check()).
        if not healthy and time.monotonic() >= next_probe:
            next_probe = time.monotonic() + 1
            healthy = _answers(url + "healthz")
            if healthy:
                if local_agent:
                    supervisor.start("agent", [PYTHON, "-m", "agent"], env=_local_agent_env(env, home, url))
                say(f"ModelForge is running at {url}  (admin {url}admin/, API {url}api/v1/schema/)")
                say(f"ports: {_ports(env, stack, local_agent)}")
                say(f"operator API key: {home / 'secrets' / 'operator-api-key'}; Ctrl-C stops everything")
                if local_agent and _flag(env, "MODELFORGE_DEMO"):
                    from modelforge.devdemo import start_demo

                    start_demo(url, home, env, say, INTERRUPTED)
        time.sleep(0.5)
    return 0


def _flag(env: dict[str, str], name: str) -> bool:
    return env.get(name, "true").lower() not in ("0", "false", "no", "off")


def _ports(env: dict[str, str], stack: EmbeddedStack, local_agent: bool) -> str:
    ports = [f"web {env.get('MODELFORGE_PORT', '8000')}"]
    if stack.postgres:
        ports.append(f"PostgreSQL {stack.pg_port}")
    if stack.redis:
        ports.append(f"Redis {stack.redis_port}")
    if local_agent:
        ports.append(f"agent {env.get('MODELFORGE_AGENT_PORT') or port_defaults(env)[2]}")
    return ", ".join(ports)


def _local_agent_env(base: dict[str, str], home: Path, url: str) -> dict[str, str]:
    """The local node's agent (the node co-located with the control plane): enrolled once with a token
    minted here, its identity kept under MODELFORGE_HOME/agent like any agent's state volume."""
    env = dict(base)
    volume = home / "agent" / "volume"
    # A model the test-echo profile can serve, so a server can be placed from the dashboard at once
    # ("Model servers" -> "Place a server": profile test-echo, model echo-demo).
    demo = volume / "models" / "echo-demo"
    if not demo.exists():
        demo.mkdir(parents=True)
        (demo / "config.json").write_text('{"engine": "agent.engines.echo"}\n')
    if not (volume / "identity.json").exists():
        minted = subprocess.run(
            [PYTHON, "manage.py", "mint_enrollment_token", "--note", "local node (make run)"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            start_new_session=True,
        )
        env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] = minted.stdout.strip()
    env.update(
        MODELFORGE_AGENT_CONTROL_PLANE_URL=url.rstrip("/"),
        MODELFORGE_AGENT_STATE_VOLUME=str(volume),
        MODELFORGE_AGENT_LISTEN_HOST="127.0.0.1",
        MODELFORGE_AGENT_ADVERTISE_HOST="127.0.0.1",
    )
    if env.get("MODELFORGE_CLUSTER_SECRET_FILE"):
        env["MODELFORGE_AGENT_CLUSTER_SECRET_FILE"] = env["MODELFORGE_CLUSTER_SECRET_FILE"]
    else:
        env["MODELFORGE_AGENT_CLUSTER_SECRET"] = env["MODELFORGE_CLUSTER_SECRET"]
    env.setdefault("MODELFORGE_AGENT_PORT", str(port_defaults(env)[2]))
    env.setdefault("MODELFORGE_AGENT_ACCELERATOR_MODE", "auto")
    return env


def up() -> int:
    home = _home()
    urls = EmbeddedStack.from_environment(home, _base_env(home)).start()
    for name, value in urls.items():
        print(f"export {name}={value}")
    return 0


def down() -> int:
    home = _home()
    # A running make run's services are its own: stopping them under it is the bug this lock prevents.
    lock = DataFolderLock(home)
    holder = lock.acquire()
    if holder is not None:
        return _refuse_in_use(home, holder)
    _stop_what_a_dead_run_left(home)  # before the services they use
    lock.release()
    EmbeddedStack.from_environment(home, _base_env(home)).stop()
    return 0


def test(pytest_args: list[str]) -> int:
    """Throw-away services (own ports, own folder), then every check the test command promises."""
    home = Path(os.environ.get("MODELFORGE_TEST_HOME") or ROOT / ".modelforge-test").resolve()
    env = _base_env(home)
    env.setdefault("MODELFORGE_EMBEDDED_PG_PORT", "54339")
    env.setdefault("MODELFORGE_EMBEDDED_REDIS_PORT", "63809")
    env["MODELFORGE_ENV"] = "development"
    env.setdefault("MODELFORGE_SECRET_KEY", "test-" + secrets.token_urlsafe(48))
    env.setdefault("MODELFORGE_OPERATOR_API_KEY", "test-operator-" + secrets.token_urlsafe(24))
    env.setdefault("MODELFORGE_CLUSTER_SECRET", "test-cluster-" + secrets.token_urlsafe(24))
    try:
        stack = EmbeddedStack.from_environment(home, env)
        stack.destroy()
        env.update(stack.start(persistent=False))
    except (EmbeddedStackError, subprocess.CalledProcessError) as exc:
        # Keep the folder: its logs say why.
        say(f"could not start the throw-away services: {exc} (logs under {home})")
        return 1
    try:
        bin_dir = Path(PYTHON).parent
        steps = [
            ["ruff", [str(bin_dir / "ruff"), "check", "."]],
            ["ruff format", [str(bin_dir / "ruff"), "format", "--check", "."]],
            ["mypy", [str(bin_dir / "mypy"), "modelforge", "apps", "agent"]],
            # The benches' scripts share names (run.py) and import their folder's neighbours by path, so they
            # are checked apart, each named by its path from the root (bench.gateway.run).
            ["mypy bench", [str(bin_dir / "mypy"), "--explicit-package-bases", "bench"]],
            ["manage.py check", [PYTHON, "manage.py", "check", "--fail-level", "WARNING"]],
            ["makemigrations --check", [PYTHON, "manage.py", "makemigrations", "--check", "--dry-run"]],
            ["pytest", [PYTHON, "-m", "pytest", *pytest_args]],
        ]
        for name, argv in steps:
            say(f"--- {name}")
            result = subprocess.run(argv, cwd=ROOT, env=env)
            if result.returncode != 0:
                say(f"{name} failed (status {result.returncode})")
                return result.returncode
        return 0
    finally:
        stack.destroy()


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "run"
    if command == "run":
        return run()
    if command == "up":
        return up()
    if command == "down":
        return down()
    if command == "test":
        return test(argv[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    # Imported: from here Ctrl-C is a KeyboardInterrupt again (below, or run()'s own handler once it starts).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        # Ctrl-C before run() took the signal over (the first moments of start-up): nothing was started.
        say("interrupted")
        say("stopped")
        sys.exit(0)
