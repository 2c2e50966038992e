"""Local artifact sources are read only under MODELFORGE_ARTIFACT_LOCAL_ROOTS, never from ModelForge's own
data (the data folder, its secrets, the store, the backups, the agent's state), with every link resolved
before the check: at registration (API) and again when the worker acquires."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3
import pytest
from django.test import override_settings

from apps.artifacts import acquisition, checks, local_roots, tasks
from apps.artifacts.models import Artifact
from modelforge import startup
from modelforge.checks import problem_of
from modelforge.config import INVALID_SETTING, SettingsReader
from tests.fixtures import PYTHON, process_env, run_command

pytestmark = pytest.mark.django_db

SECRET = b"the-secret-key-of-this-control-plane"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def b3(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


@pytest.fixture
def home(settings, tmp_path) -> Path:
    """A data folder as `make run` leaves it: secrets, store, backups, the local agent's state, and the
    `imports` folder as the only local root."""
    home = tmp_path / "home"
    for folder in ("secrets", "artifacts", "backups", "agent/volume", "imports"):
        (home / folder).mkdir(parents=True)
    (home / "secrets" / "secret-key").write_bytes(SECRET)
    (home / "secrets" / "cluster-secret").write_bytes(b"cluster-secret-value")
    (home / "agent" / "volume" / "identity.json").write_text('{"credential": "node-secret"}')
    settings.MODELFORGE_HOME = home
    settings.ARTIFACT_STORE = home / "artifacts"
    settings.BACKUP_ROOT = home / "backups"
    settings.ARTIFACT_LOCAL_ROOTS = [home / "imports"]
    return home


def register(client, locator: object, name: str = "m"):
    return client.post(
        "/api/v1/artifacts", {"name": name, "source_kind": "local", "locator": str(locator)}, format="json"
    )


def assert_refused(answer, *fragments: str) -> None:
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert set(body) == {"code", "message", "correlation_id"}
    assert body["code"] == "LOCAL_SOURCE_NOT_ALLOWED", body
    for fragment in fragments:
        assert fragment in body["message"], body["message"]


def stored_bytes(store: Path) -> list[bytes]:
    return [p.read_bytes() for p in store.rglob("*") if p.is_file()] if store.exists() else []


# Regression (issue 13, finding 3): an operator key registered …/secrets as an artifact, it passed every
# check, and any node credential could then download the secret key, operator password and cluster secret.
def test_the_secrets_folder_is_refused_through_the_api_with_the_operator_key(operator_client, home, settings):
    for locator in (
        home / "secrets",
        home / "secrets" / "secret-key",
        f"{home}/imports/../secrets",  # the path is resolved before it is judged
        home,
    ):
        assert_refused(register(operator_client, locator), "MODELFORGE_ARTIFACT_LOCAL_ROOTS")
    assert not Artifact.objects.exists()
    assert register(operator_client, home / "imports" / "model").status_code == 201  # the control

    # The configuration of the report: no root at all. Nothing local is read, and the refusal says what
    # to set.
    settings.ARTIFACT_LOCAL_ROOTS = []
    assert_refused(register(operator_client, home / "secrets", name="s"), "secrets folder")
    assert_refused(register(operator_client, home / "imports" / "model", name="s"), "is empty")


def test_a_path_outside_the_roots_is_refused(operator_client, home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_bytes(b"weights")
    assert_refused(register(operator_client, elsewhere), "is not under MODELFORGE_ARTIFACT_LOCAL_ROOTS")
    assert_refused(register(operator_client, "/etc/passwd"), "is not under")
    # Only an absolute path names a place on the worker's file system.
    assert_refused(register(operator_client, "imports/model"), "absolute path")
    assert_refused(register(operator_client, f"file://{home}/imports/model"), "absolute path")
    # A folder named like a root is not inside it.
    sibling = home / "imports-old"
    sibling.mkdir()
    assert_refused(register(operator_client, sibling), "is not under")
    assert not Artifact.objects.exists()


@pytest.mark.parametrize(
    ("inside", "what"),
    [
        ("artifacts/1", "the artifact store"),
        ("backups", "the backup root"),
        ("agent-state", "the agent's state"),
        ("", "contains"),
    ],
)
def test_the_store_backups_and_agent_state_are_refused_even_inside_a_root(
    operator_client, settings, tmp_path, monkeypatch, inside, what
):
    data = tmp_path / "data"
    for folder in ("artifacts/1", "backups", "agent-state", "models"):
        (data / folder).mkdir(parents=True)
    settings.ARTIFACT_LOCAL_ROOTS = [data]
    settings.ARTIFACT_STORE = data / "artifacts"
    settings.BACKUP_ROOT = data / "backups"
    monkeypatch.setenv("MODELFORGE_AGENT_STATE_VOLUME", str(data / "agent-state"))
    assert_refused(register(operator_client, data / inside), what)
    assert register(operator_client, data / "models").status_code == 201


def test_a_secret_file_named_by_a_file_variable_is_refused_inside_a_root(operator_client, home, monkeypatch):
    mounted = home / "imports" / "run-secrets" / "operator-api-key"
    mounted.parent.mkdir()
    mounted.write_text("operator-key-from-a-file")
    monkeypatch.setenv("MODELFORGE_OPERATOR_API_KEY_FILE", str(mounted))
    assert_refused(register(operator_client, mounted), "MODELFORGE_OPERATOR_API_KEY_FILE")
    assert_refused(register(operator_client, mounted.parent), "MODELFORGE_OPERATOR_API_KEY_FILE")


def test_the_kernels_process_files_are_refused_even_as_a_root(operator_client, home, settings):
    # /proc/self/environ holds the secrets of the process that reads it.
    settings.ARTIFACT_LOCAL_ROOTS = [Path("/proc")]
    assert_refused(register(operator_client, "/proc/self/environ"), "the kernel's /proc folder")


def test_a_root_that_contains_the_data_folder_opens_nothing(operator_client, home, settings, tmp_path):
    # Such a root is an INVALID_SETTING at start-up; development starts anyway, and the root is not used.
    settings.ARTIFACT_LOCAL_ROOTS = [tmp_path]
    (tmp_path / "models").mkdir()
    assert_refused(register(operator_client, tmp_path / "models"), "is empty or names no usable folder")
    assert_refused(register(operator_client, home / "secrets" / "secret-key"), "secrets folder")


def test_a_link_inside_a_root_to_the_secrets_is_refused_as_the_given_path(operator_client, home):
    link = home / "imports" / "innocent.safetensors"
    link.symlink_to(home / "secrets" / "secret-key")
    folder_link = home / "imports" / "innocent-model"
    folder_link.symlink_to(home / "secrets", target_is_directory=True)
    assert_refused(register(operator_client, link), "secrets folder", str(home / "secrets"))
    assert_refused(register(operator_client, folder_link), "secrets folder")
    assert not Artifact.objects.exists()

    # Registered before the link was swapped in (or by a path that was fine then): the worker resolves
    # it again and reads nothing.
    item = Artifact.objects.create(name="late", source_kind="local", locator=str(link))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert (item.state, item.failure_code) == ("failed", "LOCAL_SOURCE_NOT_ALLOWED")
    assert "secrets folder" in item.failure_message and item.files == []
    assert SECRET not in stored_bytes(home / "artifacts")


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_link_to_the_secrets_inside_the_tree_fails_the_acquisition_with_nothing_copied(
    operator_client, home, kind
):
    model = home / "imports" / "model"
    model.mkdir()
    (model / "a-first.safetensors").write_bytes(b"real weights, read before the link in name order")
    if kind == "file":
        (model / "config.json").symlink_to(home / "secrets" / "secret-key")
    else:
        (model / "tokenizer").symlink_to(home / "secrets", target_is_directory=True)
    created = register(operator_client, model)
    assert created.status_code == 201, created.content  # the given path itself is fine
    tasks.acquire(created.json()["id"])
    item = Artifact.objects.get(pk=created.json()["id"])
    assert (item.state, item.failure_code) == ("failed", "LOCAL_SOURCE_NOT_ALLOWED")
    assert ("config.json" if kind == "file" else "tokenizer") in item.failure_message
    assert "secrets folder" in item.failure_message
    assert item.files == [] and item.progress_bytes == 0
    assert stored_bytes(home / "artifacts") == []  # nothing at all was copied, not even the real file
    answer = operator_client.get(f"/api/v1/artifacts/{item.pk}").json()
    assert answer["failure_code"] == "LOCAL_SOURCE_NOT_ALLOWED"


def test_a_hard_link_to_a_secret_inside_a_root_is_refused(home):
    model = home / "imports" / "model"
    model.mkdir()
    os.link(home / "secrets" / "cluster-secret", model / "weights.safetensors")
    item = Artifact.objects.create(name="h", source_kind="local", locator=str(model))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert (item.state, item.failure_code) == ("failed", "LOCAL_SOURCE_NOT_ALLOWED")
    assert "same file as" in item.failure_message
    assert stored_bytes(home / "artifacts") == []


@pytest.mark.parametrize("kind", ["broken", "loop"])
def test_a_broken_link_or_a_link_loop_is_reported_not_skipped(home, kind):
    model = home / "imports" / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    if kind == "broken":
        (model / "config.json").symlink_to(home / "imports" / "gone.json")
    else:
        (model / "again").symlink_to(model, target_is_directory=True)
    item = Artifact.objects.create(name="b", source_kind="local", locator=str(model))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert (item.state, item.failure_code) == ("failed", "SOURCE_UNREACHABLE")
    assert ("config.json" if kind == "broken" else "again") in item.failure_message


def test_a_link_or_file_swapped_in_after_the_check_is_refused_not_read(home):
    model = home / "imports" / "model"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "secret-key").write_bytes(b"harmless weights")
    (model / "weights.safetensors").write_bytes(b"weights")
    checked = {item.relative: item for item in local_roots.walk(str(model))}
    assert sorted(checked) == ["sub/secret-key", "weights.safetensors"]

    # Between the check and the copy, a folder on the judged path becomes a link to the secrets.
    (model / "sub" / "secret-key").unlink()
    (model / "sub").rmdir()
    (model / "sub").symlink_to(home / "secrets", target_is_directory=True)
    with pytest.raises(local_roots.LocalSourceRefused, match="changed after it was checked"):
        local_roots.open_checked(checked["sub/secret-key"])

    # A file replaced by another one (another inode) is not the file that was judged.
    replacement = model / "replacement"
    replacement.write_bytes(b"other bytes")
    os.replace(replacement, model / "weights.safetensors")
    with pytest.raises(local_roots.LocalSourceRefused, match="replaced after it was checked"):
        local_roots.open_checked(checked["weights.safetensors"])


def test_a_legitimate_model_under_a_root_is_acquired_end_to_end(
    operator_client, home, django_capture_on_commit_callbacks
):
    # A hub-cache snapshot: the files are links into a blobs folder under the same root. Allowed; each is
    # stored under the link's name with its target's bytes.
    cache = home / "imports" / "hub"
    (cache / "blobs").mkdir(parents=True)
    (cache / "snapshot" / "sub").mkdir(parents=True)
    weights, config = b"\x01" * 4096, b'{"architectures": ["Llama"]}'
    (cache / "blobs" / sha(weights)).write_bytes(weights)
    (cache / "snapshot" / "model.safetensors").symlink_to(Path("..") / "blobs" / sha(weights))
    (cache / "snapshot" / "sub" / "config.json").write_bytes(config)
    with django_capture_on_commit_callbacks() as queued:
        created = register(operator_client, cache / "snapshot")
    assert created.status_code == 201 and len(queued) == 1
    tasks.acquire(created.json()["id"])  # what the registration queued for the worker
    answer = operator_client.get(f"/api/v1/artifacts/{created.json()['id']}").json()
    assert answer["state"] == "ready", answer["checks"]
    assert answer["files"] == [
        {"path": "model.safetensors", "size": len(weights), "sha256": sha(weights), "blake3": b3(weights)},
        {"path": "sub/config.json", "size": len(config), "sha256": sha(config), "blake3": b3(config)},
    ]
    stored = home / "artifacts" / str(answer["id"])
    assert (stored / "model.safetensors").read_bytes() == weights
    assert not (stored / "model.safetensors").is_symlink()  # a copy, never a link into the source


def test_a_root_removed_later_fails_the_acquisition_and_a_retry_succeeds_once_it_is_back(
    operator_client, home, settings
):
    source = home / "imports" / "m.gguf"
    source.write_bytes(b"GGUF" + b"\x00" * 64)
    created = register(operator_client, source)
    assert created.status_code == 201
    item = Artifact.objects.get(pk=created.json()["id"])

    settings.ARTIFACT_LOCAL_ROOTS = []  # the operator narrowed the setting before the worker got to it
    acquisition.acquire(item)
    item.refresh_from_db()
    assert (item.state, item.failure_code) == ("failed", "LOCAL_SOURCE_NOT_ALLOWED")
    assert "MODELFORGE_ARTIFACT_LOCAL_ROOTS" in item.failure_message
    assert stored_bytes(home / "artifacts") == []

    settings.ARTIFACT_LOCAL_ROOTS = [home / "imports"]
    tasks.acquire(item.pk)  # a retry acts on a failed artifact
    item.refresh_from_db()
    assert item.state == "ready" and item.failure_code == "" and item.files[0]["path"] == "m.gguf"


def test_the_dashboard_names_the_refusal_and_offers_the_retry(client, home, tmp_path):
    from django.contrib.auth.models import User

    # The dashboard registers no artifacts (the API does); it shows an acquisition the worker refused.
    item = Artifact.objects.create(name="outside", source_kind="local", locator=str(tmp_path))
    acquisition.acquire(item)
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get(f"/artifacts/{item.pk}/").content.decode()
    assert "<code>LOCAL_SOURCE_NOT_ALLOWED</code>" in page and "Retry the acquisition" in page
    assert "contains the data folder" in page


def test_rehydration_from_a_source_no_longer_allowed_is_blocked_and_reads_nothing(home, settings):
    source = home / "imports" / "m"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    item = Artifact.objects.create(name="r", source_kind="local", locator=str(source))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "ready"
    settings.ARTIFACT_LOCAL_ROOTS = []
    blocked = acquisition.rehydrate(item)
    assert blocked.failure_code == "ARTIFACT_REHYDRATION_BLOCKED"
    assert "LOCAL_SOURCE_NOT_ALLOWED" in blocked.failure_message
    assert not (home / "artifacts" / f"{item.pk}.rehydrating").exists()


# The setting's validation at start-up.


def root_problems(value: str, home: Path) -> list[tuple[str, str]]:
    """(code, message) of every problem with MODELFORGE_ARTIFACT_LOCAL_ROOTS, read as the settings do."""
    read = SettingsReader({"MODELFORGE_ARTIFACT_LOCAL_ROOTS": value})
    roots = read.paths("MODELFORGE_ARTIFACT_LOCAL_ROOTS")
    with override_settings(PRODUCTION=True, ARTIFACT_LOCAL_ROOTS=roots, MODELFORGE_HOME=home):
        problems = read.problems + [p for p in map(problem_of, checks.local_roots()) if p]
    return [(p.code, p.message) for p in problems if p.setting == "MODELFORGE_ARTIFACT_LOCAL_ROOTS"]


def test_roots_are_absolute_folders_that_do_not_hold_the_secrets(tmp_path):
    home = tmp_path / "home"
    (home / "secrets").mkdir(parents=True)
    assert root_problems(f"{home}/imports, /srv/models", home) == []
    assert root_problems("", home) == []  # empty: no local source, a valid choice
    for value, fragment in [
        ("models/imports", "not an absolute path"),
        (str(home), "contains the secrets folder"),
        ("/", "contains the secrets folder"),
        (f"{home}/secrets", "is the secrets folder"),
        (f"{home}/secrets/keys", "is inside the secrets folder"),
    ]:
        found = root_problems(f"/srv/models,{value}", home)
        assert len(found) == 1 and found[0][0] == INVALID_SETTING and fragment in found[0][1], (value, found)
    # A link is resolved first: a root that leads to the data folder holds the secrets too.
    (tmp_path / "innocent").symlink_to(home, target_is_directory=True)
    [(code, message)] = root_problems(str(tmp_path / "innocent"), home)
    assert code == INVALID_SETTING and "contains the secrets folder" in message


def test_production_refuses_to_start_with_a_root_that_holds_the_secrets(tmp_path):
    home = tmp_path / "home"
    env = process_env(
        MODELFORGE_ENV="production",
        MODELFORGE_DEBUG=None,
        MODELFORGE_HOME=str(home),
        MODELFORGE_SECRET_KEY="p" * 64,
        MODELFORGE_OPERATOR_API_KEY="o" * 40,
        MODELFORGE_ALLOWED_HOSTS="modelforge.example.org",
        MODELFORGE_CLUSTER_SECRET="c" * 32,
        MODELFORGE_DATABASE_URL="postgres://modelforge:Xk29-long-unique@127.0.0.1:1/modelforge",
        MODELFORGE_REDIS_URL="redis://127.0.0.1:1/0",
        MODELFORGE_ARTIFACT_LOCAL_ROOTS=f"{tmp_path},relative/models",
    )
    done = run_command([PYTHON, "manage.py", "check"], env)
    assert done.returncode == startup.EXIT_REFUSED, done.stderr
    assert f"- [INVALID_SETTING] MODELFORGE_ARTIFACT_LOCAL_ROOTS: {tmp_path} contains the secrets folder" in (
        done.stderr
    )
    assert (
        "- [INVALID_SETTING] MODELFORGE_ARTIFACT_LOCAL_ROOTS: 'relative/models' is not an absolute path"
        in (done.stderr)
    )
