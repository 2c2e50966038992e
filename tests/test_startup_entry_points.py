"""Every entry point refuses a bad production configuration with exit 3; development starts and logs."""

from __future__ import annotations

import pytest

from tests.fixtures import (
    PYTHON,
    database_url,
    free_port,
    http_ok,
    process_env,
    run_command,
    start_process,
    wait_until,
)

HEADER = "ModelForge refused to start: 2 configuration problem(s) must be resolved."
MISSING_KEY = "- [MISSING_REQUIRED_SETTING] MODELFORGE_OPERATOR_API_KEY: "
INSECURE_DB = "- [INSECURE_PRODUCTION_SETTING] MODELFORGE_DATABASE_URL: the database password is a well-known"

ENTRY_POINTS = {
    "manage.py": [PYTHON, "manage.py", "check"],
    "gunicorn (config)": [
        PYTHON,
        "-m",
        "gunicorn",
        "-c",
        "python:modelforge.gunicorn_conf",
        "modelforge.asgi:application",
    ],
    "gunicorn (bare)": [
        PYTHON,
        "-m",
        "gunicorn",
        "-k",
        "modelforge.gunicorn_worker.Worker",
        "-b",
        "127.0.0.1:0",
        "--no-control-socket",
        "modelforge.asgi:application",
    ],
    "celery worker": [PYTHON, "-m", "celery", "-A", "modelforge", "worker", "--pool", "solo"],
    "celery beat": [PYTHON, "-m", "celery", "-A", "modelforge", "beat"],
}


def broken_production_env() -> dict[str, str]:
    """Production with the operator key missing and a well-known database password; all else fine."""
    return process_env(
        MODELFORGE_ENV="production",
        MODELFORGE_OPERATOR_API_KEY=None,
        MODELFORGE_DEBUG=None,
        MODELFORGE_SECRET_KEY="p" * 64,
        MODELFORGE_ALLOWED_HOSTS="modelforge.example.org",
        MODELFORGE_CLUSTER_SECRET="c" * 32,
        # Port 1: nothing answers, so nothing could start even if validation were skipped.
        MODELFORGE_DATABASE_URL="postgres://modelforge:postgres@127.0.0.1:1/modelforge",
        MODELFORGE_REDIS_URL="redis://127.0.0.1:1/0",
    )


@pytest.mark.stack
@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_production_refuses_with_exit_3_and_lists_both_problems(entry_point):
    finished = run_command(ENTRY_POINTS[entry_point], broken_production_env(), timeout=90)
    assert finished.returncode == 3, finished.stderr[-3000:]
    lines = finished.stderr.splitlines()
    assert HEADER in lines
    after = lines[lines.index(HEADER) + 1 : lines.index(HEADER) + 3]
    assert any(line.startswith(MISSING_KEY) for line in after), after
    assert any(line.startswith(INSECURE_DB) for line in after), after


@pytest.mark.stack
def test_a_bad_boolean_and_a_bad_url_refuse_production_naming_both():
    env = process_env(
        MODELFORGE_ENV="production",
        MODELFORGE_OPERATOR_API_KEY="o" * 40,
        MODELFORGE_CLUSTER_SECRET="c" * 32,
        MODELFORGE_SECRET_KEY="p" * 64,
        MODELFORGE_ALLOWED_HOSTS="modelforge.example.org",
        MODELFORGE_DATABASE_URL="postgres://modelforge:Str0ng-and-long@127.0.0.1:1/modelforge",
        MODELFORGE_REDIS_URL="http://not-redis:6379",
        MODELFORGE_DEBUG="perhaps",
    )
    finished = run_command(ENTRY_POINTS["manage.py"], env)
    assert finished.returncode == 3
    assert "ModelForge refused to start: 2 configuration problem(s) must be resolved." in finished.stderr
    assert "- [INVALID_SETTING] MODELFORGE_DEBUG: 'perhaps' is not a boolean" in finished.stderr
    assert "- [INVALID_SETTING] MODELFORGE_REDIS_URL: scheme 'http' is not supported" in finished.stderr


@pytest.mark.stack
def test_a_misspelt_environment_fails_closed():
    env = process_env(MODELFORGE_ENV="Production", MODELFORGE_WEB_WORKERS="two")
    finished = run_command(ENTRY_POINTS["manage.py"], env)
    assert finished.returncode == 3, finished.stderr[-2000:]
    assert (
        "- [INVALID_SETTING] MODELFORGE_ENV: 'Production' is not one of development, production"
        in finished.stderr
    )
    assert "- [INVALID_SETTING] MODELFORGE_WEB_WORKERS: 'two' is not a whole number" in finished.stderr


def development(**extra: str) -> dict[str, str]:
    """The same broken configuration, in development."""
    env = broken_production_env()
    env["MODELFORGE_ENV"] = "development"
    env["MODELFORGE_ALLOWED_HOSTS"] = "127.0.0.1"
    env.update(extra)
    return env


@pytest.mark.stack
def test_development_logs_the_same_problems_and_runs_the_command():
    finished = run_command(ENTRY_POINTS["manage.py"], development())
    assert finished.returncode == 0, finished.stderr
    # The same problems come back as system-check warnings, not "no issues" (issue 16).
    assert "System check identified some issues" in finished.stderr
    assert "(modelforge.MISSING_REQUIRED_SETTING) production requires an operator API key" in (
        finished.stdout + finished.stderr
    )
    assert "WARNING" in finished.stderr
    assert "[MISSING_REQUIRED_SETTING] MODELFORGE_OPERATOR_API_KEY" in finished.stderr
    assert "[INSECURE_PRODUCTION_SETTING] MODELFORGE_DATABASE_URL" in finished.stderr


@pytest.mark.stack
def test_development_web_application_starts_under_gunicorn_and_logs_the_problems(django_db_setup, tmp_path):
    # The database password is "postgres" in the URL; the embedded test server trusts any password.
    insecure_url = database_url().replace("postgres@", "postgres:postgres@", 1)
    port = free_port()
    env = development(
        MODELFORGE_DATABASE_URL=insecure_url,
        MODELFORGE_BIND=f"127.0.0.1:{port}",
        MODELFORGE_REDIS_URL=process_env()["MODELFORGE_REDIS_URL"],
    )
    running = start_process(
        [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
        env,
        tmp_path / "web.log",
    )
    try:
        assert wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 60), running.log()
        log = running.log()
        assert "[MISSING_REQUIRED_SETTING] MODELFORGE_OPERATOR_API_KEY" in log
        assert "[INSECURE_PRODUCTION_SETTING] MODELFORGE_DATABASE_URL" in log
    finally:
        running.stop()
