"""The agent as its own distribution (agent/pyproject.toml): a node installs it alone, without the control
plane. One test installs ./agent into an empty virtualenv and starts it there; the others read both
pyproject files and every import under agent/."""

from __future__ import annotations

import ast
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import agent

ROOT = Path(__file__).resolve().parents[2]
AGENT_DIR = ROOT / "agent"

# The import name → the distribution that provides it, for every third-party module agent/ imports.
PROVIDERS = {
    "httpx": "httpx",
    "blake3": "blake3",
    "pynvml": "nvidia-ml-py",
    "llama_cpp": "llama-cpp-python",
}


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower()


def third_party_imports() -> dict[str, set[str]]:
    """Every top-level module agent/ imports (``import x``, ``from x import``, ``import_module("x")``)
    that is neither the standard library nor the agent itself, with the files that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted(AGENT_DIR.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[1] in {"build"} or relative.parts[1].endswith(".egg-info"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names = [str(node.args[0].value)]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "agent" or top == "__future__":
                    continue
                found.setdefault(top, set()).add(str(relative))
    return found


def test_the_agent_declares_exactly_the_libraries_it_imports() -> None:
    project = tomllib.loads((AGENT_DIR / "pyproject.toml").read_text())["project"]
    imported = third_party_imports()
    assert "django" not in imported and "apps" not in imported and "modelforge" not in imported, imported
    unknown = set(imported) - set(PROVIDERS)
    assert not unknown, f"agent/ imports {unknown}: declare it in agent/pyproject.toml and PROVIDERS"

    required = {requirement_name(r) for r in project["dependencies"]}
    optional = {requirement_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    # llama.cpp is the one optional engine (imported inside the engine's own process only).
    assert required == {PROVIDERS[name] for name in imported} - {"llama-cpp-python"}
    assert optional == {"llama-cpp-python"}
    assert project["scripts"] == {"modelforge-agent": "agent.__main__:main"}


def test_the_control_plane_pins_this_agent_and_does_not_package_its_files() -> None:
    agent_project = tomllib.loads((AGENT_DIR / "pyproject.toml").read_text())
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert agent_project["project"]["version"] == agent.__version__
    assert f"modelforge-agent=={agent.__version__}" in root["project"]["dependencies"]
    # One owner per file: the agent's package and console script are the agent distribution's.
    assert not any(p.startswith("agent") for p in root["tool"]["setuptools"]["packages"]["find"]["include"])
    assert "modelforge-agent" not in root["project"].get("scripts", {})


@pytest.mark.stack
def test_the_agent_installs_alone_into_an_empty_virtualenv_and_starts_there(tmp_path: Path) -> None:
    # Built from a copy: an in-tree build would leave agent/build/ (a second copy of every module) behind.
    source = tmp_path / "src"
    shutil.copytree(AGENT_DIR, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    bin_dir = venv / "bin"
    # pip's own cache and the machine's configuration (mirror, find-links) are used as they are.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DJANGO", "MODELFORGE"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    installed = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert installed.returncode == 0, installed.stderr

    def run(*argv: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        # From an empty folder, so that nothing of this checkout is on the path.
        return subprocess.run(
            list(argv), cwd=tmp_path, env=env | (extra or {}), capture_output=True, text=True, timeout=60
        )

    # Every module of the agent imports there, and nothing of the control plane comes with it.
    probe = run(
        str(bin_dir / "python"),
        "-c",
        "import importlib, pkgutil, sys, agent\n"
        "for m in pkgutil.walk_packages(agent.__path__, 'agent.'): importlib.import_module(m.name)\n"
        "print(agent.__file__)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in {'django', 'apps', 'modelforge'}))\n"
        "import django\n",
    )
    assert "ModuleNotFoundError: No module named 'django'" in probe.stderr, probe.stderr
    where, leaked = probe.stdout.splitlines()
    assert Path(where).is_relative_to(venv), where
    assert leaked == "[]"
    freeze = run(str(bin_dir / "python"), "-m", "pip", "freeze").stdout.lower()
    for library in ("django", "celery", "psycopg", "djangorestframework", "gunicorn"):
        assert library not in freeze, freeze

    helped = run(str(bin_dir / "modelforge-agent"), "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: modelforge-agent")
    version = run(str(bin_dir / "modelforge-agent"), "--version")
    assert version.stdout.strip() == f"modelforge-agent {agent.__version__}"

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver: the NVML refusal is proven on machines without one")
    started = run(
        str(bin_dir / "modelforge-agent"),
        extra={
            "HOME": str(tmp_path / "home"),
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9",
            "MODELFORGE_AGENT_CLUSTER_SECRET": "a-cluster-secret-of-32-characters",
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": "never-sent",
            "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia",
        },
    )
    assert started.returncode == 3, started.stderr
    # nvidia-ml-py came with the agent (pynvml imported); only the driver library is missing here.
    assert "modelforge-agent refused to start: [NVIDIA_NVML_UNAVAILABLE]" in started.stderr
    assert "nvmlInit failed" in started.stderr, started.stderr
