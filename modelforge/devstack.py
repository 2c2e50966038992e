"""``make run`` and ``make test``: the whole platform on the embedded default, from one command.

    python -m modelforge.devstack run     # services, migrate, operator login, web + worker + beat
    python -m modelforge.devstack test    # throw-away services, then lint, checks and pytest
    python -m modelforge.devstack up|down # only the embedded services (for manage.py by hand)

PostgreSQL and Redis come from PyPI wheels (``modelforge.embedded``) unless ``MODELFORGE_DATABASE_URL``
/ ``MODELFORGE_REDIS_URL`` are set. Ctrl-C stops every process this started, services last.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from modelforge.embedded import EmbeddedStack, EmbeddedStackError

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def say(message: str) -> None:
    print(f"modelforge: {message}", flush=True)


def _secret_file(path: Path, length: int) -> str:
    """A random secret kept in a 0600 file under MODELFORGE_HOME, made on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(length))
    return path.read_text().strip()


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env, check=True)


def _wait_http(url: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 -- our own loopback URL
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    return False


class Supervisor:
    """Runs the platform's processes, each in its own session so only we receive Ctrl-C."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.children[name] = subprocess.Popen(argv, cwd=ROOT, env=env or self.env, start_new_session=True)

    def first_exited(self) -> tuple[str, int] | None:
        for name, child in self.children.items():
            code = child.poll()
            if code is not None:
                return name, code
        return None

    def stop_all(self, grace: float = 15) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children.values():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.wait(remaining)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _base_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["MODELFORGE_HOME"] = str(home)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run() -> int:
    home = Path(os.environ.get("MODELFORGE_HOME") or ROOT / ".modelforge").resolve()
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

    say(f"data folder {home}")
    # The backup root of the embedded default (a configured MODELFORGE_BACKUP_ROOT is the operator's to
    # provide: a missing one is refused as DESTINATION_UNAVAILABLE, never created behind their back).
    if not env.get("MODELFORGE_BACKUP_ROOT"):
        (home / "backups").mkdir(parents=True, exist_ok=True)
    try:
        stack = EmbeddedStack.from_environment(home, env)
        env.update(stack.start())
    except (EmbeddedStackError, subprocess.CalledProcessError) as exc:
        say(f"could not start the embedded services: {exc}")
        return 1
    supervisor = Supervisor(env)

    def _stop(signum: int, frame: object) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    code = 0
    try:
        _manage(env, "migrate", "--noinput")
        if env.get("MODELFORGE_OBSERVABILITY_DATABASE_URL"):  # monitoring history in a database of its own
            _manage(env, "migrate", "--database", "observability", "--noinput")
        _manage(env, "ensure_operator", "--credentials-file", str(home / "secrets" / "operator-login"))
        host = env.get("MODELFORGE_HOST", "127.0.0.1")
        port = env.get("MODELFORGE_PORT", "8000")
        supervisor.start(
            "web",
            [
                PYTHON,
                "-m",
                "gunicorn",
                "-c",
                "python:modelforge.gunicorn_conf",
                "modelforge.asgi:application",
            ],
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
        healthy = _wait_http(url + "healthz", 60)
        if healthy and env.get("MODELFORGE_LOCAL_AGENT", "true").lower() not in ("0", "false", "no", "off"):
            supervisor.start("agent", [PYTHON, "-m", "agent"], env=_local_agent_env(env, home, url))
        if healthy:
            say(f"ModelForge is running at {url}  (admin {url}admin/, API {url}api/v1/schema/)")
            say(f"operator API key: {home / 'secrets' / 'operator-api-key'}; Ctrl-C stops everything")
        while not supervisor.stopping:
            exited = supervisor.first_exited()
            if exited:
                name, code = exited
                say(f"the {name} process exited with status {code}; stopping everything")
                code = code or 1
                break
            time.sleep(0.5)
    except subprocess.CalledProcessError as exc:
        say(f"a set-up step failed ({' '.join(map(str, exc.cmd[1:]))}: status {exc.returncode})")
        code = exc.returncode or 1
    finally:
        say("stopping")
        supervisor.stop_all()
        stack.stop()
        say("stopped")
    return code


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
    env.setdefault("MODELFORGE_AGENT_PORT", "8471")
    env.setdefault("MODELFORGE_AGENT_ACCELERATOR_MODE", "auto")
    return env


def up() -> int:
    home = Path(os.environ.get("MODELFORGE_HOME") or ROOT / ".modelforge").resolve()
    urls = EmbeddedStack.from_environment(home, _base_env(home)).start()
    for name, value in urls.items():
        print(f"export {name}={value}")
    return 0


def down() -> int:
    home = Path(os.environ.get("MODELFORGE_HOME") or ROOT / ".modelforge").resolve()
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
    sys.exit(main(sys.argv[1:]))
