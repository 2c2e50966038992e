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
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def interpreter() -> str:
    """The Python every process of a bench runs on (this one's): its version and the interpreter the
    virtualenv was made from. A bench's CPU figures depend on it: a build without profile-guided and
    link-time optimisation (pyenv's default) measured about 20 % more gateway CPU per request than
    Debian's optimised one (bench/gateway/README.md, 2026-12-06 (late night))."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return f"Python {sys.version.split()[0]}, virtualenv made from {base}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def throwaway_stack(
    pg_port: int | None = None, redis_port: int | None = None
) -> Iterator[tuple[Path, dict[str, str]]]:
    """Start the stack, migrate, export its settings into this process; yield (workdir, env). The ports are
    free ones unless given."""
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
        MODELFORGE_EMBEDDED_PG_PORT=str(pg_port or free_port()),
        MODELFORGE_EMBEDDED_REDIS_PORT=str(redis_port or free_port()),
        MODELFORGE_SECRET_KEY=secrets.token_urlsafe(48),
        MODELFORGE_OPERATOR_API_KEY=secrets.token_urlsafe(32),
        MODELFORGE_CLUSTER_SECRET=secrets.token_urlsafe(32),
        # Most benches run no Celery worker or beat: after 2-3 minutes the web processes would raise
        # BEAT_MISSING and WORKER_MISSING, log them into the bench's tables and start delivering alert
        # notifications themselves (about 1 ms of CPU a second more, measured 2026-12-03), which a
        # platform with its worker and beat running never does. A bench that needs the alerts sets its own.
        MODELFORGE_WORKER_MISSING_AFTER="86400",
        MODELFORGE_BEAT_MISSING_AFTER="86400",
    )
    env.pop("MODELFORGE_DATABASE_URL", None)
    env.pop("MODELFORGE_REDIS_URL", None)
    stack = EmbeddedStack.from_environment(Path(env["MODELFORGE_HOME"]), env)
    try:
        env.update(stack.start(persistent=False))
        os.environ.update(env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")  # not set by a plain shell
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


def start_web(
    env: dict[str, str],
    port: int,
    *,
    workers: int = 1,
    pin_core: str | None = "0",
    new_session: bool = True,
    prefix: list[str] | None = None,
) -> subprocess.Popen[bytes]:
    """The web application under gunicorn + uvicorn workers on 127.0.0.1:``port`` (pinned to a core);
    ``prefix``: a command it runs under (valgrind)."""
    argv = [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"]
    if prefix:
        argv = [*prefix, *argv]
    if pin_core is not None:
        argv = ["taskset", "-c", pin_core, *argv]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={
            **env,
            "MODELFORGE_BIND": f"127.0.0.1:{port}",
            "MODELFORGE_WEB_WORKERS": str(workers),
            "MODELFORGE_LOG_LEVEL": env.get("MODELFORGE_LOG_LEVEL", "WARNING"),
        },
        start_new_session=new_session,
    )


def route_to_one_backend(host: str, port: int) -> None:
    """rag.embedding@1 and chat.general@1 served by one running 'server' at host:port (no agent)."""
    route_to_backends(host, {"bench": port})


def route_to_backends(
    host: str,
    ports: dict[str, int],
    *,
    capabilities: Iterable[str] = ("rag.embedding@1", "chat.general@1"),
    profile: str = "test-echo",
    algorithm: str | None = None,
) -> Any:
    """One cluster of running 'servers' (member name -> port on ``host``, no agent) serving
    ``capabilities``; returns the cluster (its ``algorithm`` is the runtime knob a bench may turn)."""
    from django.utils import timezone

    from apps.clusters.models import Capability, Cluster, ClusterMember, RoutingTier, digest
    from apps.nodes.models import Node
    from apps.servers.models import ModelServer

    node = Node.objects.create(
        name="bench",
        accelerator="cpu",
        credential_hash=digest("bench-node"),
        liveness="online",
        last_heartbeat_at=timezone.now() + timedelta(days=1),
        agent_url=f"http://{host}:1",
    )
    cluster = Cluster.objects.create(name="bench", **({"algorithm": algorithm} if algorithm else {}))
    for name, port in ports.items():
        server = ModelServer.objects.create(
            name=name, profile=profile, model="bench", node=node, port=port, state="running"
        )
        ClusterMember.objects.create(cluster=cluster, name=name, server=server)
    for name in capabilities:
        RoutingTier.objects.create(capability=Capability.objects.create(name=name), cluster=cluster)
    return cluster


def wait_http(url: str, seconds: float = 60) -> None:
    """Until ``GET url`` answers below 500."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer")


def demo_gguf(models_dir: Path) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF in ``models_dir`` (``manage.py install_demo_gguf``; ``make engines``)."""
    from django.core.management import call_command

    call_command("install_demo_gguf", models_dir=models_dir)
    (gguf,) = models_dir.glob("*.gguf")
    return gguf


def start_llama_server(
    env: dict[str, str],
    gguf: Path,
    port: int,
    *,
    core: str | None = "0",
    n_ctx: int = 512,
    extra: Iterable[str] = (),
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """llama-cpp-python's OpenAI-compatible server on one thread (pinned to ``core``), in a session of
    its own; its output to ``log`` (``--verbose`` is the server's default) or nowhere."""
    argv = [PYTHON, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", str(n_ctx)]
    argv += list(extra)
    if core is not None:
        argv = ["taskset", "-c", core, *argv]
    out: Any = subprocess.DEVNULL if log is None else log.open("ab")
    try:
        return subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        if log is not None:
            out.close()


def stop(process: subprocess.Popen[bytes], seconds: float = 20) -> None:
    """SIGTERM to a process started in a session of its own (its group), SIGKILL if it lingers."""
    import signal

    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(seconds)
