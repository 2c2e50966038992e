"""The production example environment — what compose/compose.yaml with compose/compose.production.yaml
gives the web, worker and beat processes, its secrets filled in as the overlay asks — passes Django's
``check --deploy`` with no warning, and passes start-up validation (``run_entry_checks``: configuration,
then the database) against a real, migrated database of the test stack."""

from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from django.conf import settings

from tests.fixtures import admin_connection, run_command

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose"

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}
INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, variables: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name, operator, argument = match.group(1), match.group(2) or "", match.group(3) or ""
        given = variables.get(name)
        empty = given is None or (given == "" and operator.startswith(":"))
        if operator.endswith("?") and empty:
            raise AssertionError(f"Compose refuses to render: {name}: {argument}")
        if operator.endswith("-") and empty:
            return argument
        return given or ""

    return INTERPOLATION.sub(one, value)


def production_environment(service: str, variables: dict[str, str]) -> dict[str, str]:
    """The service's environment as Compose merges the base file and the production overlay."""
    base = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    overlay = yaml.safe_load((COMPOSE / "compose.production.yaml").read_text())
    merged: dict[str, str] = {}
    for document in (base, overlay):
        merged |= {k: str(v) for k, v in (document["services"][service].get("environment") or {}).items()}
    return {name: interpolate(value, variables) for name, value in merged.items()}


def operator_secrets() -> dict[str, str]:
    """What an operator gives the overlay, generated as docs/CONFIGURATION.md says (openssl rand -hex 32)."""
    return {
        "MODELFORGE_SECRET_KEY": secrets.token_hex(32),
        "MODELFORGE_OPERATOR_API_KEY": secrets.token_hex(32),
        "MODELFORGE_DATABASE_PASSWORD": secrets.token_hex(32),
        "MODELFORGE_CLUSTER_SECRET": secrets.token_hex(32),
        "MODELFORGE_ALLOWED_HOSTS": "modelforge.corp.internal",
        "MODELFORGE_CSRF_TRUSTED_ORIGINS": "https://modelforge.corp.internal",
    }


@pytest.fixture
def deploy_role():
    """A login role with the rendered URL's user name and a generated password, allowed to read the
    test database (start-up validation reads its migration records); dropped afterwards."""
    role = "modelforge_deploy_check"
    password = secrets.token_hex(32)
    with admin_connection() as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        conn.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}' IN ROLE pg_read_all_data")
    yield role, password
    with admin_connection() as conn:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def child_environment(rendered: dict[str, str], tmp_path: Path) -> dict[str, str]:
    # Only what the image itself adds (Dockerfile: MODELFORGE_HOME) and a PATH: nothing of this test run.
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MODELFORGE_HOME": str(tmp_path)} | rendered


def against_the_test_stack(rendered: dict[str, str], role: str) -> dict[str, str]:
    """The rendered environment with Compose's service names (postgres, redis) pointed at the test
    stack's servers; the user, password, and every other value stay as rendered."""
    db = settings.DATABASES["default"]
    url = urlsplit(rendered["MODELFORGE_DATABASE_URL"])
    assert (url.hostname, url.port, url.username) == ("postgres", 5432, "modelforge")
    rendered_db = f"postgres://{role}:{url.password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT')}"
    redis = urlsplit(settings.REDIS_URL)
    return rendered | {
        "MODELFORGE_DATABASE_URL": f"{rendered_db}/{db['NAME']}",
        "MODELFORGE_REDIS_URL": f"redis://{redis.hostname}:{redis.port}/0",
    }


@pytest.mark.parametrize("service", ["web", "worker", "beat"])
def test_the_production_overlay_passes_check_deploy_with_no_warning(service, tmp_path):
    rendered = production_environment(service, operator_secrets())
    assert rendered["MODELFORGE_ENV"] == "production"

    done = run_command(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        child_environment(rendered, tmp_path),
        timeout=120,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout


def test_check_deploy_still_fails_on_a_weakened_production_environment(tmp_path):
    """The pass above means something: turning HSTS off in the same environment is a warning that fails."""
    rendered = production_environment("web", operator_secrets()) | {"MODELFORGE_HSTS_SECONDS": "0"}

    done = run_command(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        child_environment(rendered, tmp_path),
        timeout=120,
    )

    assert done.returncode == 1
    assert "security.W004" in done.stderr


@pytest.mark.django_db
def test_the_production_overlay_passes_start_up_validation_on_a_migrated_database(deploy_role, tmp_path):
    role, password = deploy_role
    variables = operator_secrets() | {"MODELFORGE_DATABASE_PASSWORD": password}
    rendered = against_the_test_stack(production_environment("web", variables), role)

    done = run_command(
        [
            sys.executable,
            "-c",
            "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'modelforge.settings')\n"
            "from modelforge.startup import run_entry_checks\n"
            "run_entry_checks('deploy check')\n"
            "from modelforge.compatibility import check_database\n"
            "print('compatible' if check_database() is None else 'incompatible')\n",
        ],
        child_environment(rendered, tmp_path),
        timeout=120,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    # Reached and judged: not "unreachable" (which starts anyway), not a refusal (exit 3).
    assert done.stdout.strip().splitlines()[-1] == "compatible", done.stdout + done.stderr
    assert "unreachable" not in done.stderr, done.stderr
    assert "refused to start" not in done.stderr, done.stderr
