"""INCOMPATIBLE_DATABASE: PostgreSQL older than 16, and schema revisions TOO_OLD / TOO_NEW / UNKNOWN."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests.fixtures import PYTHON, database_url, process_env, run_command

# The machine's system PostgreSQL 15 service: real, and older than ModelForge supports.
PG15_URL = os.environ.get("MODELFORGE_TEST_PG15_URL", "postgres://postgres@127.0.0.1:5432/postgres")

pytestmark = pytest.mark.stack


def env_for(url: str) -> dict[str, str]:
    return process_env(MODELFORGE_DATABASE_URL=url)


def check_database(url: str):
    return run_command([PYTHON, "manage.py", "check_database"], env_for(url))


def migrate(url: str, *args: str) -> None:
    finished = run_command([PYTHON, "manage.py", "migrate", "--noinput", *args], env_for(url), timeout=120)
    assert finished.returncode == 0, finished.stderr


def execute(url: str, sql: str, params: tuple[object, ...] = ()) -> None:
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(sql, params)  # type: ignore[arg-type]


def pg15_or_skip() -> str:
    try:
        with psycopg.connect(PG15_URL.replace("postgres://", "postgresql://", 1), connect_timeout=3) as conn:
            major = conn.info.server_version // 10000
    except psycopg.OperationalError as exc:
        pytest.skip(f"the system PostgreSQL 15 at {PG15_URL} is not reachable: {exc}")
    if major != 15:
        pytest.skip(f"{PG15_URL} is PostgreSQL {major}, not 15")
    return PG15_URL


def test_the_test_database_itself_is_compatible(django_db_setup):
    finished = check_database(database_url())
    assert finished.returncode == 0, finished.stderr
    assert "compatible" in finished.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["manage.py", "check_database"],
        ["-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
        ["-m", "celery", "-A", "modelforge", "worker", "--pool", "solo"],
        ["-m", "celery", "-A", "modelforge", "beat"],
    ],
    ids=["check_database", "web", "worker", "beat"],
)
def test_postgresql_15_is_refused_at_start(argv):
    url = pg15_or_skip()
    finished = run_command([PYTHON, *argv], env_for(url), timeout=90)
    assert finished.returncode == 3, finished.stderr[-2000:]
    assert "ModelForge refused to start: the database is not compatible" in finished.stderr
    assert (
        "- [INCOMPATIBLE_DATABASE] MODELFORGE_DATABASE_URL: POSTGRES_TOO_OLD: PostgreSQL 15."
        in finished.stderr
    )
    assert "older than the supported major 16" in finished.stderr


def test_an_empty_database_is_unknown(scratch_database):
    finished = check_database(database_url(scratch_database()))
    assert finished.returncode == 3
    assert "[INCOMPATIBLE_DATABASE] MODELFORGE_DATABASE_URL: UNKNOWN: the database has no schema at all" in (
        finished.stderr
    )
    assert "manage.py migrate" in finished.stderr


def test_a_foreign_database_is_unknown(scratch_database):
    url = database_url(scratch_database())
    execute(url, "CREATE TABLE customers (id serial PRIMARY KEY, name text)")
    finished = check_database(url)
    assert finished.returncode == 3
    assert "UNKNOWN: the database holds 1 table(s) but no ModelForge schema history" in finished.stderr


def test_unapplied_migrations_are_too_old_and_the_web_refuses(scratch_database):
    url = database_url(scratch_database())
    migrate(url)
    migrate(url, "sessions", "zero")
    finished = check_database(url)
    assert finished.returncode == 3
    assert "TOO_OLD: 1 migration(s) of release" in finished.stderr
    assert "sessions.0001_initial" in finished.stderr
    assert "run `python manage.py migrate`" in finished.stderr

    web = run_command(
        [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
        env_for(url),
    )
    assert web.returncode == 3
    assert "[INCOMPATIBLE_DATABASE] MODELFORGE_DATABASE_URL: TOO_OLD" in web.stderr

    migrate(url)
    assert check_database(url).returncode == 0


def test_a_migration_this_release_lacks_is_too_new(scratch_database):
    url = database_url(scratch_database())
    migrate(url)
    execute(
        url,
        "INSERT INTO django_migrations (app, name, applied) VALUES (%s, %s, now())",
        ("core", "0999_from_a_newer_release"),
    )
    finished = check_database(url)
    assert finished.returncode == 3
    assert "TOO_NEW: the database was migrated by a newer ModelForge release" in finished.stderr
    assert "core.0999_from_a_newer_release" in finished.stderr


def test_migrate_refuses_postgresql_15_and_creates_nothing():
    """Seed difference (issue 16): migrate created a schema on PostgreSQL 15 that the rest refuse."""
    admin = pg15_or_skip()
    name = f"mf_pg15_migrate_{os.getpid()}"
    execute(admin, f'DROP DATABASE IF EXISTS "{name}"')
    execute(admin, f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    try:
        finished = run_command([PYTHON, "manage.py", "migrate", "--noinput"], env_for(url), timeout=120)
        assert finished.returncode == 3, finished.stderr[-2000:]
        assert "ModelForge refused to start: the database is not compatible" in finished.stderr
        assert (
            "- [INCOMPATIBLE_DATABASE] MODELFORGE_DATABASE_URL: POSTGRES_TOO_OLD: PostgreSQL 15."
            in finished.stderr
        )
        with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as conn:
            tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        assert tables == (0,)
    finally:
        execute(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_still_creates_an_unknown_database_and_fixes_a_too_old_one(scratch_database):
    url = database_url(scratch_database())
    assert "UNKNOWN" in check_database(url).stderr
    migrate(url)
    migrate(url, "sessions", "zero")
    assert "TOO_OLD" in check_database(url).stderr
    migrate(url)
    assert check_database(url).returncode == 0
