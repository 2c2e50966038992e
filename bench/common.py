"""What every benchmark here needs: a throw-away PostgreSQL 16 + Redis (the embedded stack) in a
temporary folder, the settings pointing at it, and the schema migrated."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def throwaway_stack() -> Iterator[tuple[Path, dict[str, str]]]:
    """Start the stack, migrate, export its settings into this process; yield (workdir, env)."""
    sys.path.insert(0, str(ROOT))
    from modelforge.embedded import EmbeddedStack

    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-"))
    workdir.chmod(0o755)
    env = dict(os.environ)
    env.update(
        MODELFORGE_ENV="development",
        MODELFORGE_DEBUG="false",
        MODELFORGE_LOG_LEVEL="WARNING",
        MODELFORGE_HOME=str(workdir / "home"),
        MODELFORGE_EMBEDDED_PG_PORT=str(free_port()),
        MODELFORGE_EMBEDDED_REDIS_PORT=str(free_port()),
        MODELFORGE_SECRET_KEY=secrets.token_urlsafe(48),
        MODELFORGE_OPERATOR_API_KEY=secrets.token_urlsafe(32),
        MODELFORGE_CLUSTER_SECRET=secrets.token_urlsafe(32),
    )
    env.pop("MODELFORGE_DATABASE_URL", None)
    env.pop("MODELFORGE_REDIS_URL", None)
    stack = EmbeddedStack.from_environment(Path(env["MODELFORGE_HOME"]), env)
    try:
        env.update(stack.start(persistent=False))
        os.environ.update(env)
        subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        yield workdir, env
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        stack.destroy()
        shutil.rmtree(workdir, ignore_errors=True)
