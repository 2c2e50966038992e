"""Acquisition from a real HTTP server on 127.0.0.1 and from a local path, digests recorded; the
supply-chain rules; quarantine released only by an operator's recorded decision and a clean re-check."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import blake3
import pytest

from apps.artifacts import acquisition, tasks
from apps.artifacts.models import Artifact
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def b3(data: bytes) -> str:
    """BLAKE3 computed here, apart from the acquisition's own hashing (single-threaded, whole buffer)."""
    return blake3.blake3(data).hexdigest()


ASKED: list[str] = []  # the paths the test HTTP server was asked for


@pytest.fixture(autouse=True)
def store(settings, tmp_path):
    settings.ARTIFACT_STORE = tmp_path / "store"
    settings.ARTIFACT_LOCAL_ROOTS = [tmp_path]  # local sources are read only under a root (test_local_roots)
    return settings.ARTIFACT_STORE


@pytest.fixture
def http_root(tmp_path) -> Iterator[tuple[Path, str]]:
    """A real HTTP server (stdlib, with Range support via our handler) serving a folder on 127.0.0.1."""
    root = tmp_path / "served"
    root.mkdir()

    ASKED.clear()

    class RangeHandler(SimpleHTTPRequestHandler):
        def send_head(self):
            ASKED.append(self.path)
            ranged = self.headers.get("Range")
            path = Path(self.translate_path(self.path))
            if not ranged or not path.is_file():
                return super().send_head()
            start = int(ranged.split("=", 1)[1].split("-", 1)[0])
            data = path.read_bytes()
            self.send_response(206)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            import io

            return io.BytesIO(data[start:])

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(RangeHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def artifact(**fields) -> Artifact:
    return Artifact.objects.create(**{"name": "a", **fields})


def test_an_http_artifact_is_acquired_with_its_digest(http_root):
    root, base = http_root
    data = b"GGUF" + b"\x00" * 5000
    (root / "tiny.gguf").write_bytes(data)
    item = artifact(source_kind="http", locator=f"{base}/tiny.gguf", expected_sha256={"tiny.gguf": sha(data)})
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "ready", item.checks
    assert item.files == [{"path": "tiny.gguf", "size": len(data), "sha256": sha(data), "blake3": b3(data)}]
    assert item.format == "gguf_file" and item.progress_bytes == len(data)
    assert {c["rule"]: c["outcome"] for c in item.checks}["DIGEST_MATCH"] == "pass"


def test_an_interrupted_download_resumes_from_its_part_file(http_root, store):
    root, base = http_root
    data = bytes(range(256)) * 400
    (root / "w.safetensors").write_bytes(data)
    item = artifact(source_kind="http", locator=f"{base}/w.safetensors")
    target = Path(store) / str(item.pk)
    target.mkdir(parents=True)
    (target / "w.safetensors.part").write_bytes(data[:30000])  # what an interrupted transfer left
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "ready"
    assert item.files[0]["sha256"] == sha(data)
    assert item.files[0]["blake3"] == b3(data)  # the resumed part is in it too


def test_a_local_directory_is_acquired_file_by_file(tmp_path):
    source = tmp_path / "model"
    (source / "sub").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(b"weights")
    (source / "sub" / "config.json").write_bytes(b"{}")
    item = artifact(source_kind="local", locator=str(source), licence="apache-2.0")
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "ready"
    assert [f["path"] for f in item.files] == ["model.safetensors", "sub/config.json"]
    assert item.format == "safetensors_directory"


def test_a_tampered_file_is_quarantined_naming_the_rule_and_release_needs_a_clean_recheck(tmp_path):
    source = tmp_path / "m"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"tampered weights")
    item = artifact(
        source_kind="local", locator=str(source), expected_sha256={"model.safetensors": sha(b"weights")}
    )
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "quarantined" and item.quarantine_rule == "DIGEST_MATCH"
    assert "model.safetensors" in next(c["detail"] for c in item.checks if c["rule"] == "DIGEST_MATCH")

    # An operator cannot wave it through: the checks run again and still fail.
    from modelforge.errors import ApiError

    with pytest.raises(ApiError) as caught:
        acquisition.release(item, by="alice", reason="looks fine to me")
    assert caught.value.code == "ARTIFACT_QUARANTINED" and "DIGEST_MATCH" in caught.value.message
    assert item.events.filter(by="alice", detail__contains="looks fine to me").exists()

    # The real file restored in the store: the release is recorded with who and why, and passes.
    Path(item.store_path, "model.safetensors").write_bytes(b"weights")
    released = acquisition.release(item, by="alice", reason="restored the verified file from backup")
    assert released.state == "ready"
    assert released.events.filter(to_state="ready", by="alice").exists()
    changed = released.events.get(detail__startswith="the store's copy differs")
    assert changed.by == "alice" and "model.safetensors" in changed.detail
    assert sha(b"tampered weights")[:12] in changed.detail and sha(b"weights")[:12] in changed.detail


def test_pickle_weights_are_quarantined_unless_allowed(tmp_path, settings):
    source = tmp_path / "p"
    source.mkdir()
    (source / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert (item.state, item.quarantine_rule) == ("quarantined", "FORMAT_ALLOWED")
    settings.ARTIFACT_ALLOW_PICKLE = True
    assert acquisition.release(item, by="bob", reason="trusted internal checkpoint").state == "ready"


@pytest.mark.parametrize(
    ("setting", "value", "rule"),
    [
        ("ARTIFACT_MAX_BYTES", 3, "SIZE_BOUNDS"),
        ("ARTIFACT_REQUIRE_LICENCE", True, "LICENCE_REQUIRED"),
        ("ARTIFACT_ALLOWED_SOURCES", ["http"], "ALLOWED_SOURCE"),
    ],
)
def test_each_rule_quarantines_by_its_name(tmp_path, settings, setting, value, rule):
    source = tmp_path / "f.gguf"
    source.write_bytes(b"GGUF")
    item = artifact(source_kind="local", locator=str(source))
    item.files = [{"path": "f.gguf", "size": 4, "sha256": sha(b"GGUF")}]
    item.size_bytes = 4
    setattr(settings, setting, value)
    acquisition.judge(item, acquisition.run_checks(item))
    assert (item.state, item.quarantine_rule) == ("quarantined", rule)


def test_an_unreachable_source_is_reported_not_hung_on(settings):
    settings.ARTIFACT_TIMEOUT_S = 2
    settings.ARTIFACT_HF_ENDPOINT = "http://127.0.0.1:1"
    item = artifact(source_kind="huggingface", locator="org/model", revision="a" * 40)
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "failed" and item.failure_code == "SOURCE_UNREACHABLE"
    assert "cannot be reached from here" in item.failure_message


def test_the_hubs_digests_unconsulted_are_deferred_never_a_pass():
    item = artifact(source_kind="huggingface", locator="org/model", revision="b" * 40)
    outcomes = {c["rule"]: c["outcome"] for c in acquisition.run_checks(item)}
    assert outcomes["DIGEST_MATCH"] == "DEFERRED_EXTERNAL_VALIDATION"
    unpinned = artifact(name="u", source_kind="huggingface", locator="org/model", revision="main")
    assert {c["rule"]: c["outcome"] for c in acquisition.run_checks(unpinned)}["REVISION_PINNED"] == "fail"


def test_the_api_requests_and_releases_with_the_envelope(operator_client, tmp_path):
    created = operator_client.post(
        "/api/v1/artifacts",
        {"name": "m1", "source_kind": "local", "locator": str(tmp_path), "expected_sha256": {"x": "short"}},
        format="json",
    )
    assert created.status_code == 400 and created.json()["code"] == "VALIDATION_ERROR"
    # Not tmp_path itself: it holds the store, which is never read as a source.
    created = operator_client.post(
        "/api/v1/artifacts",
        {"name": "m1", "source_kind": "local", "locator": str(tmp_path / "m1")},
        format="json",
    )
    assert created.status_code == 201 and created.json()["state"] == "requested"
    refused = operator_client.post(
        f"/api/v1/artifacts/{created.json()['id']}/release", {"reason": "x"}, format="json"
    )
    assert refused.status_code == 409 and refused.json()["code"] == "ARTIFACT_NOT_QUARANTINED"


def test_rehydration_succeeds_from_an_intact_upstream_and_is_blocked_when_it_changed_or_vanished(tmp_path):
    source = tmp_path / "upstream"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"the weights")
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    item.refresh_from_db()
    store = Path(item.store_path)

    # The store's copy is lost: the intact upstream brings it back, verified.
    import shutil

    shutil.rmtree(store)
    assert acquisition.rehydrate(item).state == "ready"
    assert (store / "model.safetensors").read_bytes() == b"the weights"

    # The upstream changed: refused by name, with what was tried; never another source.
    (source / "model.safetensors").write_bytes(b"other weights")
    blocked = acquisition.rehydrate(item)
    assert (blocked.state, blocked.failure_code) == ("failed", "ARTIFACT_REHYDRATION_BLOCKED")
    assert (
        f"tried local {source}" in blocked.failure_message and "model.safetensors" in blocked.failure_message
    )

    # The upstream vanished.
    shutil.rmtree(source)
    gone = acquisition.rehydrate(item)
    assert gone.failure_code == "ARTIFACT_REHYDRATION_BLOCKED" and "does not exist" in gone.failure_message


def test_the_dashboard_shows_quarantine_and_releases_with_a_reason(client, tmp_path, settings):
    from django.contrib.auth.models import User

    source = tmp_path / "p"
    source.mkdir()
    (source / "model.bin").write_bytes(b"pickle")
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get(f"/artifacts/{item.pk}/").content.decode()
    assert "Quarantined by <code>FORMAT_ALLOWED</code>" in page and 'id="checks"' in page
    refused = client.post(f"/artifacts/{item.pk}/release", {"reason": "please"}, follow=True).content.decode()
    assert "ARTIFACT_QUARANTINED" in refused
    settings.ARTIFACT_ALLOW_PICKLE = True
    released = client.post(f"/artifacts/{item.pk}/release", {"reason": "internal, trusted"}, follow=True)
    assert "released: every check passes" in released.content.decode()
    assert item.name in client.get("/artifacts/?state=ready").content.decode()
    item.refresh_from_db()
    assert (
        item.state == "ready" and item.events.filter(by="ops", detail__contains="internal, trusted").exists()
    )


def test_rehydration_is_never_a_way_out_of_quarantine(tmp_path):
    from modelforge.errors import ApiError

    source = tmp_path / "p"
    source.mkdir()
    (source / "model.bin").write_bytes(b"pickle")
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "quarantined"
    with pytest.raises(ApiError) as caught:
        acquisition.rehydrate(item)
    assert caught.value.code == "ARTIFACT_QUARANTINED"
    item.refresh_from_db()
    assert item.state == "quarantined"


def test_a_blocked_rehydration_is_not_undone_by_a_retry(tmp_path):
    from apps.artifacts.tasks import acquire

    item = artifact(
        source_kind="local",
        locator=str(tmp_path / "gone"),
        state="failed",
        failure_code="ARTIFACT_REHYDRATION_BLOCKED",
    )
    assert acquire(item.pk) == "blocked"
    item.refresh_from_db()
    assert item.failure_code == "ARTIFACT_REHYDRATION_BLOCKED"


def test_a_quarantined_records_licence_is_amended_with_who_and_why_then_released(
    tmp_path, settings, operator_client
):
    source = tmp_path / "f.gguf"
    source.write_bytes(b"GGUF")
    item = artifact(source_kind="local", locator=str(source), state="quarantined", store_path=str(tmp_path))
    item.files = [{"path": "f.gguf", "size": 4, "sha256": sha(b"GGUF")}]
    item.size_bytes = 4
    item.save()
    settings.ARTIFACT_REQUIRE_LICENCE = True
    url = f"/api/v1/artifacts/{item.pk}"
    refused = operator_client.post(url + "/amend", {"reason": "", "licence": "apache-2.0"}, format="json")
    assert refused.status_code == 400
    refused = operator_client.post(url + "/amend", {"reason": "x", "name": "other"}, format="json")
    assert refused.status_code == 400  # only licence and expected digests
    amended = operator_client.post(
        url + "/amend", {"reason": "upstream card says so", "licence": "apache-2.0"}, format="json"
    )
    assert amended.status_code == 200, amended.content
    assert amended.json()["state"] == "quarantined"  # amending is not releasing
    item.refresh_from_db()
    event = item.events.get(detail__startswith="record amended")
    assert event.by and "upstream card says so" in event.detail and "apache-2.0" in event.detail
    released = operator_client.post(url + "/release", {"reason": "licence now recorded"}, format="json")
    assert released.status_code == 200 and released.json()["state"] == "ready"
    again = operator_client.post(url + "/amend", {"reason": "y", "licence": "mit"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "ARTIFACT_NOT_QUARANTINED"


@pytest.fixture
def fake_hub(tmp_path) -> Iterator[tuple[dict[str, bytes], str]]:
    """A Hugging Face-shaped hub on 127.0.0.1: the revision API and resolve/ URLs of one repository."""
    import json as jsonlib
    from http.server import BaseHTTPRequestHandler
    from urllib.parse import unquote

    files: dict[str, bytes] = {}
    revision = "c" * 40

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self):
            path = unquote(self.path)
            if path == f"/api/models/org/model/revision/{revision}":
                body = jsonlib.dumps(
                    {"sha": revision, "siblings": [{"rfilename": n} for n in files]}
                ).encode()
            elif (
                path.startswith(f"/org/model/resolve/{revision}/")
                and path.split(f"{revision}/", 1)[1] in files
            ):
                body = files[path.split(f"{revision}/", 1)[1]]
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield files, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_hub_repository_keeps_its_nested_paths_and_counts_progress_across_files(fake_hub, settings):
    files, url = fake_hub
    files.update(
        {
            "config.json": b"{}",
            "weights/model-00001.safetensors": b"A" * 10,
            "weights/model-00002.safetensors": b"B" * 20,
        }
    )
    settings.ARTIFACT_HF_ENDPOINT = url
    item = artifact(source_kind="huggingface", locator="org/model", revision="c" * 40)
    acquisition.acquire(item)
    item.refresh_from_db()
    assert sorted(f["path"] for f in item.files) == sorted(files)  # nested paths kept, none flattened
    assert item.size_bytes == item.progress_bytes == 32
    assert item.state == "ready", item.checks


def test_a_hub_that_refuses_or_lists_nothing_is_a_named_failure(fake_hub, settings):
    files, url = fake_hub
    settings.ARTIFACT_HF_ENDPOINT = url
    missing = artifact(source_kind="huggingface", locator="org/other", revision="c" * 40)
    acquisition.acquire(missing)
    missing.refresh_from_db()
    assert missing.failure_code == "SOURCE_UNREACHABLE" and "answered 404" in missing.failure_message
    empty = artifact(name="e", source_kind="huggingface", locator="org/model", revision="c" * 40)
    acquisition.acquire(empty)
    empty.refresh_from_db()
    assert empty.failure_code == "SOURCE_UNREACHABLE" and "lists no files" in empty.failure_message
    files["../escape.bin"] = b"x"
    unsafe = artifact(name="u", source_kind="huggingface", locator="org/model", revision="c" * 40)
    acquisition.acquire(unsafe)
    unsafe.refresh_from_db()
    assert unsafe.failure_code == "SOURCE_UNREACHABLE" and "unsafe file name" in unsafe.failure_message


def test_an_empty_source_is_quarantined_by_size_bounds(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    item = artifact(source_kind="local", locator=str(empty))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert (item.state, item.quarantine_rule) == ("quarantined", "SIZE_BOUNDS")
    assert "no weights" in next(c["detail"] for c in item.checks if c["rule"] == "SIZE_BOUNDS")


def test_a_refused_source_is_quarantined_before_anything_is_fetched_and_release_then_fetches(
    http_root, settings, store, django_capture_on_commit_callbacks
):
    root, base = http_root
    data = b"GGUF" + b"\x01" * 3000
    (root / "tiny.gguf").write_bytes(data)
    settings.ARTIFACT_ALLOWED_HOSTS = ["models.internal.example"]
    item = artifact(source_kind="http", locator=f"{base}/tiny.gguf")
    acquisition.acquire(item)
    item.refresh_from_db()
    assert (item.state, item.quarantine_rule) == ("quarantined", "ALLOWED_SOURCE")
    assert item.files == [] and item.acquired_at is None and item.progress_bytes == 0
    assert not any(store.glob("**/*.gguf"))  # nothing was downloaded
    outcomes = {c["rule"]: c["outcome"] for c in item.checks}
    assert outcomes["ALLOWED_SOURCE"] == "fail" and outcomes["DIGEST_MATCH"] == "skipped"
    assert ASKED == []  # the server was never asked

    # Released while the rule still fails: refused, still nothing fetched.
    with pytest.raises(ApiError) as refused:
        acquisition.release(item, by="ops", reason="we trust it")
    assert refused.value.code == "ARTIFACT_QUARANTINED"
    item.refresh_from_db()
    assert item.state == "quarantined" and ASKED == []

    # The operator allows the host; release records who and why and fetches now, every rule run again.
    settings.ARTIFACT_ALLOWED_HOSTS = ["127.0.0.1"]
    with django_capture_on_commit_callbacks() as queued:
        released = acquisition.release(item, by="ops", reason="mirror approved in CHG-42")
    assert released.state == "requested" and len(queued) == 1  # the acquisition task, once committed
    assert item.events.filter(by="ops", detail__contains="CHG-42").exists()
    tasks.acquire(item.pk)  # what the release queued (the API test runs it through the worker)
    item.refresh_from_db()
    assert item.state == "ready", item.checks
    assert item.files == [{"path": "tiny.gguf", "size": len(data), "sha256": sha(data), "blake3": b3(data)}]
    assert ASKED == ["/tiny.gguf"]


def test_an_unpinned_hub_revision_is_refused_before_any_download(settings):
    item = artifact(source_kind="huggingface", locator="org/model", revision="main")
    acquisition.acquire(item)  # no hub is reachable from the tests: a fetch would be a failure instead
    item.refresh_from_db()
    assert (item.state, item.quarantine_rule) == ("quarantined", "REVISION_PINNED")
    assert item.failure_code == "" and item.files == []


def test_the_dashboard_amends_a_quarantined_record_and_retries_a_failed_acquisition(
    client, tmp_path, settings, django_capture_on_commit_callbacks
):
    from django.contrib.auth.models import User

    settings.ARTIFACT_REQUIRE_LICENCE = True
    source = tmp_path / "m"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.quarantine_rule == "LICENCE_REQUIRED"
    client.force_login(User.objects.create_user("ops", is_staff=True))
    url = f"/artifacts/{item.pk}"
    assert 'id="amend"' in client.get(url + "/").content.decode()

    bad = client.post(url + "/amend", {"reason": "x", "expected_sha256": "model.safetensors"}, follow=True)
    assert "VALIDATION_ERROR" in bad.content.decode()
    not_hex = client.post(
        url + "/amend", {"reason": "x", "expected_sha256": "model.safetensors zz"}, follow=True
    ).content.decode()
    assert "VALIDATION_ERROR" in not_hex
    page = client.post(
        url + "/amend",
        {
            "reason": "model card says apache-2.0",
            "licence": "apache-2.0",
            "expected_sha256": f"model.safetensors {sha(b'weights')}\n",
        },
        follow=True,
    ).content.decode()
    assert "stays quarantined" in page
    item.refresh_from_db()
    assert item.state == "quarantined" and item.licence == "apache-2.0"
    assert item.expected_sha256 == {"model.safetensors": sha(b"weights")}
    assert item.events.filter(by="ops", detail__contains="model card says apache-2.0").exists()
    client.post(url + "/release", {"reason": "licence recorded"})
    item.refresh_from_db()
    assert item.state == "ready"

    failed = artifact(name="gone", source_kind="local", locator=str(tmp_path / "nowhere"))
    acquisition.acquire(failed)
    failed.refresh_from_db()
    assert failed.failure_code == "SOURCE_UNREACHABLE"
    assert "Retry the acquisition" in client.get(f"/artifacts/{failed.pk}/").content.decode()
    with django_capture_on_commit_callbacks() as queued:
        client.post(f"/artifacts/{failed.pk}/retry")
    assert len(queued) == 1
    refused = client.post(f"/artifacts/{item.pk}/retry", follow=True).content.decode()
    assert "Only a failed acquisition is retried" in refused


def test_the_dashboard_refuses_a_replica_for_a_node_that_is_not_one(client, tmp_path):
    from django.contrib.auth.models import User

    source = tmp_path / "f.gguf"
    source.write_bytes(b"GGUF" + b"\x00" * 10)
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    client.force_login(User.objects.create_user("ops", is_staff=True))
    for junk in ("", "not-a-uuid", "7"):
        page = client.post(f"/artifacts/{item.pk}/replicate", {"node": junk}, follow=True)
        assert page.status_code == 200 and "choose an enrolled node" in page.content.decode()


def test_the_blake3_recorded_at_acquisition_equals_an_independent_computation(tmp_path):
    # Larger than one hashing read (8 MiB), so the multithreaded, block-by-block digest is compared with
    # a one-shot single-threaded one over the whole file.
    big = (bytes(range(256)) * 4096) * 9 + b"tail"
    source = tmp_path / "weights"
    (source / "sub").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(big)
    (source / "sub" / "config.json").write_bytes(b"{}")
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "ready", item.checks
    assert item.files == [
        {"path": "model.safetensors", "size": len(big), "sha256": sha(big), "blake3": b3(big)},
        {"path": "sub/config.json", "size": 2, "sha256": sha(b"{}"), "blake3": b3(b"{}")},
    ]


def acquired_before_blake3(tmp_path, files: dict[str, bytes]) -> Artifact:
    """A ready artifact as an older release recorded it: path, size and SHA-256 only."""
    source = tmp_path / "old"
    source.mkdir()
    for name, data in files.items():
        (source / name).write_bytes(data)
    item = artifact(source_kind="local", locator=str(source))
    acquisition.acquire(item)
    item.refresh_from_db()
    assert item.state == "ready", item.checks
    item.files = [{key: f[key] for key in ("path", "size", "sha256")} for f in item.files]
    item.save(update_fields=["files"])
    return item


def test_an_artifact_acquired_before_blake3_gets_it_recorded_from_its_store_copy(tmp_path):
    item = acquired_before_blake3(tmp_path, {"a.safetensors": b"a" * 5000, "config.json": b"{}"})
    assert tasks.record_blake3(item.pk) == "2 recorded"
    item.refresh_from_db()
    assert [(f["path"], f["blake3"]) for f in item.files] == [
        ("a.safetensors", b3(b"a" * 5000)),
        ("config.json", b3(b"{}")),
    ]
    assert tasks.record_blake3(item.pk) == "0 recorded"  # once: a full record is left alone


def test_no_blake3_is_recorded_for_a_store_file_that_no_longer_matches_its_sha256(tmp_path):
    # A BLAKE3 taken from rotten bytes would vouch for them: that file keeps SHA-256 verification only.
    item = acquired_before_blake3(tmp_path, {"a.safetensors": b"a" * 5000, "config.json": b"{}"})
    Path(item.store_path, "a.safetensors").write_bytes(b"b" * 5000)
    assert acquisition.record_blake3(item) == ["config.json"]
    item.refresh_from_db()
    assert "blake3" not in item.files[0] and item.files[1]["blake3"] == b3(b"{}")
    assert item.files[0]["sha256"] == sha(b"a" * 5000)  # the identity is never rewritten
    assert item.events.filter(detail__contains="a.safetensors no longer matches its SHA-256").exists()


def test_a_record_changed_meanwhile_is_not_overwritten_by_the_blake3_pass(tmp_path):
    item = acquired_before_blake3(tmp_path, {"a.safetensors": b"a" * 5000})
    stale = Artifact.objects.get(pk=item.pk)
    item.files = [{**item.files[0], "size": 5000}]  # re-recorded elsewhere (a release re-hashes)
    item.files.append({"path": "b.safetensors", "size": 1, "sha256": sha(b"b")})
    item.save(update_fields=["files"])
    assert acquisition.record_blake3(stale) == []
    item.refresh_from_db()
    assert len(item.files) == 2 and all("blake3" not in f for f in item.files)
