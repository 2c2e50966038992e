"""Acquiring an artifact into the control plane's store, and the supply-chain checks that gate it.

Transfers are bounded (size, time), resumable (HTTP ``Range`` from a ``.part`` file) and verified (every
file's SHA-256 recorded). A source that cannot be reached from here is reported, not hung on.

Every file's BLAKE3 is recorded beside its SHA-256, from the same read: the SHA-256 is the artifact's
identity (the supply-chain rules and rehydration compare against it); the BLAKE3 is what a node verifies
a replica against, because SHA-256 on one core bound replication (bench/replication). An artifact
acquired before BLAKE3 was recorded gets it once, from its store copy, on its first replication
(``record_blake3``); until then nodes verify its replicas with SHA-256.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import blake3
import httpx
from django.conf import settings
from django.utils import timezone

from apps.artifacts import codes, local_roots
from apps.artifacts.models import Artifact, ArtifactState, SourceKind
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError

logger = logging.getLogger(__name__)

CHUNK = 1 << 20
# Hashing reads: large enough for BLAKE3 to spread one block over several cores.
HASH_CHUNK = 8 << 20
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
HF_REVISION = re.compile(r"^[0-9a-f]{40}$")


class SourceUnreachable(Exception):
    """The upstream could not be reached or read; the message says what was tried."""


def store_dir(artifact: Artifact) -> Path:
    return Path(settings.ARTIFACT_STORE) / str(artifact.pk)


def _progress(artifact: Artifact, done: int) -> None:
    Artifact.objects.filter(pk=artifact.pk).update(progress_bytes=done)


def _copy_local(artifact: Artifact, target: Path) -> None:
    """Copy a local source that the roots allow (``local_roots``): the whole tree is judged, links
    resolved, before the first byte is read; ``LocalSourceRefused`` otherwise."""
    local_roots.admit(artifact.locator)  # before its existence is told: a refused path reveals nothing
    if not os.path.exists(artifact.locator):
        raise SourceUnreachable(f"{artifact.locator} does not exist (is the path mounted here?)")
    try:
        files = local_roots.walk(artifact.locator)
        done = 0
        for item in files:
            destination = target / item.relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            with local_roots.open_checked(item) as reader, destination.open("wb") as writer:
                for block in iter(lambda: reader.read(CHUNK), b""):
                    writer.write(block)
                    done += len(block)
                    if done > settings.ARTIFACT_MAX_BYTES:
                        raise SourceUnreachable(
                            f"larger than MODELFORGE_ARTIFACT_MAX_BYTES ({settings.ARTIFACT_MAX_BYTES})"
                        )
            _progress(artifact, done)
    except OSError as exc:  # unreadable, a broken link, a link loop: reported, never a crashed task
        raise SourceUnreachable(
            f"cannot read {exc.filename or artifact.locator} in {artifact.locator} ({exc.strerror or exc})"
        ) from exc


def _safe_relative(name: str) -> Path:
    """A file path from an upstream listing, kept relative and inside the artifact's folder."""
    relative = Path(name)
    if not name or relative.is_absolute() or ".." in relative.parts:
        raise SourceUnreachable(f"the upstream lists an unsafe file name {name!r}")
    return relative


def _download(artifact: Artifact, url: str, target: Path, relative: str | None = None, base: int = 0) -> int:
    """One file over HTTP(S), resumed from its ``.part`` file when the server honours ``Range``; saved
    under ``relative`` (nested folders kept) or the URL's file name. Returns the file's size; progress
    counts from ``base`` (the bytes of the artifact's earlier files)."""
    name = relative or Path(urlsplit(url).path).name or "download"
    destination = target / _safe_relative(name)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    have = partial.stat().st_size if partial.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    timeout = httpx.Timeout(settings.ARTIFACT_TIMEOUT_S, connect=min(10.0, settings.ARTIFACT_TIMEOUT_S))
    try:
        with httpx.stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as response:
            if response.status_code == 416 and have:
                pass  # already complete
            elif response.status_code not in (200, 206):
                raise SourceUnreachable(f"GET {url} answered {response.status_code}")
            else:
                mode = "ab" if response.status_code == 206 else "wb"
                done = have if mode == "ab" else 0
                with partial.open(mode) as writer:
                    for block in response.iter_bytes(CHUNK):
                        writer.write(block)
                        done += len(block)
                        if done > settings.ARTIFACT_MAX_BYTES:
                            raise SourceUnreachable(
                                f"larger than MODELFORGE_ARTIFACT_MAX_BYTES ({settings.ARTIFACT_MAX_BYTES})"
                            )
                        _progress(artifact, base + done)
    except httpx.HTTPError as exc:
        raise SourceUnreachable(f"GET {url} failed: {type(exc).__name__}") from exc
    partial.rename(destination)
    return destination.stat().st_size


def _hf_url(artifact: Artifact) -> str:
    return f"{settings.ARTIFACT_HF_ENDPOINT.rstrip('/')}/{artifact.locator}/resolve/{artifact.revision}/"


def fetch(artifact: Artifact, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if artifact.source_kind == SourceKind.LOCAL:
        _copy_local(artifact, target)
    elif artifact.source_kind == SourceKind.HTTP:
        _download(artifact, artifact.locator, target)
    else:
        # A repository at an exact revision: its file list comes from the hub's API.
        hub = settings.ARTIFACT_HF_ENDPOINT.rstrip("/")
        api = f"{hub}/api/models/{artifact.locator}/revision/{artifact.revision}"
        try:
            answer = httpx.get(api, timeout=min(10.0, settings.ARTIFACT_TIMEOUT_S))
        except httpx.HTTPError as exc:
            raise SourceUnreachable(
                f"the hub at {settings.ARTIFACT_HF_ENDPOINT} cannot be reached from here "
                f"({type(exc).__name__})"
            ) from exc
        if answer.status_code != 200:
            raise SourceUnreachable(
                f"the hub answered {answer.status_code} for {artifact.locator} at revision "
                f"{artifact.revision} (no such repository or revision, or it needs a token)"
            )
        try:
            listing = answer.json()
            names = [str(sibling["rfilename"]) for sibling in listing["siblings"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceUnreachable(f"the hub's file list for {artifact.locator} is not readable") from exc
        if not names:
            raise SourceUnreachable(f"the hub lists no files for {artifact.locator} at {artifact.revision}")
        done = 0
        for name in names:
            done += _download(artifact, _hf_url(artifact) + quote(name), target, relative=name, base=done)


def file_digests(path: Path) -> tuple[str, str]:
    """(SHA-256, BLAKE3) of one file, hex, from a single read (both hashers release the GIL; BLAKE3 is
    multithreaded and costs a fraction of the SHA-256)."""
    sha = hashlib.sha256()
    tree = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with path.open("rb") as reader:
        for block in iter(lambda: reader.read(HASH_CHUNK), b""):
            sha.update(block)
            tree.update(block)
    return sha.hexdigest(), tree.hexdigest()


def digests(root: Path) -> Iterator[dict[str, Any]]:
    """Every file under ``root``, sorted: path, size, SHA-256 and BLAKE3."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        sha256, tree = file_digests(path)
        yield {
            "path": str(path.relative_to(root)),
            "size": path.stat().st_size,
            "sha256": sha256,
            "blake3": tree,
        }


def record_blake3(artifact: Artifact) -> list[str]:
    """Record the BLAKE3 of every file of a ready artifact that has none (acquired before BLAKE3 was
    recorded); returns the paths recorded.

    1. Each such file of the store copy is read once for both digests.
    2. Its BLAKE3 is recorded only when that read's SHA-256 equals the record: a BLAKE3 taken from bytes
       that rotted since acquisition would vouch for them. A file that does not match, or is missing,
       keeps no BLAKE3 (its replicas are verified with SHA-256 and fail as before), and the artifact's
       history says so.
    3. The record is swapped in only if nobody changed it meanwhile (a release re-hashes everything).
    """
    before = artifact.files
    if artifact.state != ArtifactState.READY or all("blake3" in f for f in before):
        return []
    after, recorded, wrong = [], [], []
    for item in before:
        item = dict(item)
        if "blake3" not in item:
            try:
                sha256, tree = file_digests(Path(artifact.store_path) / item["path"])
            except OSError as exc:
                wrong.append(f"{item['path']} unreadable ({exc.strerror or exc})")
            else:
                if sha256 == item["sha256"]:
                    item["blake3"] = tree
                    recorded.append(item["path"])
                else:
                    wrong.append(f"{item['path']} no longer matches its SHA-256")
        after.append(item)
    if recorded and not Artifact.objects.filter(pk=artifact.pk, files=before).update(files=after):
        return []  # the record changed under us (a release or a rehydration): it carries its own BLAKE3s
    if wrong:
        logger.warning(
            "artifact %s: the store copy differs from the record: %s", artifact.pk, "; ".join(wrong)
        )
        artifact.events.create(
            from_state=artifact.state,
            to_state=artifact.state,
            by="record_blake3",
            detail=("no BLAKE3 recorded, the store's copy differs from the record: " + "; ".join(wrong))[
                :1000
            ],
        )
    artifact.files = after
    return recorded


def detect_format(files: list[dict[str, Any]]) -> str:
    names = [f["path"] for f in files]
    gguf = [n for n in names if n.endswith(".gguf")]
    if gguf:
        return "gguf_file" if len(names) == 1 else "gguf_directory"
    if any(n.endswith(PICKLE_SUFFIXES) for n in names):
        return "pickle"
    if any(n.endswith(".safetensors") for n in names):
        return "safetensors_directory"
    return "unknown"


SOURCE_RULES = (codes.RULE_ALLOWED_SOURCE, codes.RULE_REVISION_PINNED)
CONTENT_RULES = (
    codes.RULE_DIGEST_MATCH,
    codes.RULE_FORMAT_ALLOWED,
    codes.RULE_SIZE_BOUNDS,
    codes.RULE_LICENCE_REQUIRED,
)


def source_checks(artifact: Artifact) -> list[dict[str, str]]:
    """The rules about where the weights come from, judged before a byte is fetched: a source the
    policy refuses is never downloaded."""
    checks: list[dict[str, str]] = []

    def record(rule: str, outcome: str, detail: str) -> None:
        checks.append({"rule": rule, "outcome": outcome, "detail": detail})

    allowed = settings.ARTIFACT_ALLOWED_SOURCES
    host = urlsplit(artifact.locator).hostname if artifact.source_kind == SourceKind.HTTP else None
    if artifact.source_kind not in allowed:
        record(
            codes.RULE_ALLOWED_SOURCE,
            "fail",
            f"source kind {artifact.source_kind} is not in "
            f"MODELFORGE_ARTIFACT_ALLOWED_SOURCES ({', '.join(allowed)})",
        )
    elif host and settings.ARTIFACT_ALLOWED_HOSTS and host not in settings.ARTIFACT_ALLOWED_HOSTS:
        record(codes.RULE_ALLOWED_SOURCE, "fail", f"host {host} is not in MODELFORGE_ARTIFACT_ALLOWED_HOSTS")
    else:
        record(codes.RULE_ALLOWED_SOURCE, "pass", f"{artifact.source_kind} source")
    if artifact.source_kind == SourceKind.HUGGINGFACE and not HF_REVISION.match(artifact.revision):
        record(
            codes.RULE_REVISION_PINNED, "fail", "a Hugging Face source needs an exact 40-hex commit revision"
        )
    else:
        record(codes.RULE_REVISION_PINNED, "pass", artifact.revision or "the source itself is the identity")
    return checks


def run_checks(artifact: Artifact) -> list[dict[str, str]]:
    """Every supply-chain rule, in order, with its outcome: pass, fail, skipped, or
    DEFERRED_EXTERNAL_VALIDATION (a check that needs an outside service: never a pass)."""
    checks = source_checks(artifact)

    def record(rule: str, outcome: str, detail: str) -> None:
        checks.append({"rule": rule, "outcome": outcome, "detail": detail})

    recorded = {f["path"]: f["sha256"] for f in artifact.files}
    if artifact.expected_sha256:
        wrong = [p for p, sha in artifact.expected_sha256.items() if recorded.get(p) != sha]
        if wrong:
            record(codes.RULE_DIGEST_MATCH, "fail", "SHA-256 does not match for: " + ", ".join(sorted(wrong)))
        else:
            record(codes.RULE_DIGEST_MATCH, "pass", f"{len(artifact.expected_sha256)} file(s) match")
    elif artifact.source_kind == SourceKind.HUGGINGFACE:
        record(
            codes.RULE_DIGEST_MATCH,
            codes.DEFERRED_EXTERNAL_VALIDATION,
            "the hub's digests could not be consulted from here",
        )
    else:
        record(
            codes.RULE_DIGEST_MATCH,
            "skipped",
            "no expected digests given; the recorded ones are the identity",
        )
    if artifact.format == "pickle" and not settings.ARTIFACT_ALLOW_PICKLE:
        record(
            codes.RULE_FORMAT_ALLOWED,
            "fail",
            "pickle-based weights can run code when loaded; set "
            "MODELFORGE_ARTIFACT_ALLOW_PICKLE=true only if you trust the source",
        )
    else:
        record(codes.RULE_FORMAT_ALLOWED, "pass", artifact.format)
    if not artifact.files or artifact.size_bytes <= 0:
        # An empty folder or file is not weights: nothing to serve, nothing a digest could vouch for.
        record(codes.RULE_SIZE_BOUNDS, "fail", "no weights: the artifact has no files or is empty")
    elif artifact.size_bytes > settings.ARTIFACT_MAX_BYTES:
        record(codes.RULE_SIZE_BOUNDS, "fail", f"{artifact.size_bytes} bytes > {settings.ARTIFACT_MAX_BYTES}")
    else:
        record(codes.RULE_SIZE_BOUNDS, "pass", f"{artifact.size_bytes} bytes")
    if settings.ARTIFACT_REQUIRE_LICENCE and not artifact.licence:
        record(
            codes.RULE_LICENCE_REQUIRED,
            "fail",
            "MODELFORGE_ARTIFACT_REQUIRE_LICENCE is on; record the licence",
        )
    else:
        record(codes.RULE_LICENCE_REQUIRED, "pass", artifact.licence or "not required")
    return checks


def judge(artifact: Artifact, checks: list[dict[str, str]], *, by: str = "", detail: str = "") -> None:
    """Ready when no rule failed; otherwise quarantined with the first rule that failed."""
    failed = [c for c in checks if c["outcome"] == "fail"]
    if failed:
        artifact.transition(
            ArtifactState.QUARANTINED,
            detail=f"{failed[0]['rule']}: {failed[0]['detail']}",
            by=by,
            checks=checks,
            quarantine_rule=failed[0]["rule"],
        )
    else:
        artifact.transition(
            ArtifactState.READY,
            detail=detail or "every check passed",
            by=by,
            checks=checks,
            quarantine_rule="",
        )


def _refused_before_fetch(artifact: Artifact) -> bool:
    """Quarantine with the source rule that fails, nothing fetched (the content rules are skipped)."""
    checks = source_checks(artifact)
    if not any(c["outcome"] == "fail" for c in checks):
        return False
    checks += [
        {"rule": rule, "outcome": "skipped", "detail": "not fetched: the source was refused first"}
        for rule in CONTENT_RULES
    ]
    judge(artifact, checks)
    return True


def acquire(artifact: Artifact) -> None:
    """Judge the source, fetch into the store, record every file's digest, run every check; report an
    unreachable source."""
    if _refused_before_fetch(artifact):
        return
    target = store_dir(artifact)
    artifact.transition(
        ArtifactState.ACQUIRING,
        detail=f"from {artifact.source_kind} {artifact.locator}",
        store_path=str(target),
        failure_code="",  # a retry's earlier failure is history (its event row), not this attempt's
        failure_message="",
    )
    try:
        fetch(artifact, target)
    except local_roots.LocalSourceRefused as exc:
        shutil.rmtree(target, ignore_errors=True)  # nothing read from a refused source is kept
        artifact.transition(
            ArtifactState.FAILED,
            detail=str(exc),
            failure_code=codes.LOCAL_SOURCE_NOT_ALLOWED,
            failure_message=str(exc),
        )
        return
    except SourceUnreachable as exc:
        artifact.transition(
            ArtifactState.FAILED,
            detail=str(exc),
            failure_code=codes.SOURCE_UNREACHABLE,
            failure_message=str(exc),
        )
        return
    files = list(digests(target))
    artifact.files = files
    artifact.size_bytes = sum(f["size"] for f in files)
    artifact.format = detect_format(files)
    artifact.acquired_at = timezone.now()
    artifact.save(update_fields=["files", "size_bytes", "format", "acquired_at"])
    judge(artifact, run_checks(artifact))


def release(artifact: Artifact, *, by: str, reason: str) -> Artifact:
    """An operator's explicit decision, recorded with who and why, and a fresh pass of the checks over
    freshly hashed files: quarantine is not a staging area to empty."""
    if artifact.state != ArtifactState.QUARANTINED:
        raise ApiError(codes.ARTIFACT_NOT_QUARANTINED, f"Artifact {artifact.name} is {artifact.state}.", 409)
    if not reason.strip():
        raise ApiError("VALIDATION_ERROR", "Say why it may be released (reason).", 400)
    artifact.events.create(
        from_state=artifact.state, to_state=artifact.state, by=by, detail=f"release requested: {reason}"
    )
    if artifact.acquired_at is None and not artifact.files:  # refused before anything was fetched
        return _release_unfetched(artifact, by=by, reason=reason)
    fresh = list(digests(Path(artifact.store_path)))
    changed = _changed_files(artifact.files, fresh)
    if changed:  # the store's copy is judged as it is now; the history says what differs from acquisition
        artifact.events.create(
            from_state=artifact.state,
            to_state=artifact.state,
            by=by,
            detail=("the store's copy differs from what was acquired: " + "; ".join(changed))[:1000],
        )
    artifact.files = fresh
    artifact.save(update_fields=["files"])
    judge(artifact, run_checks(artifact), by=by, detail=f"released by {by}: {reason}")
    if artifact.state == ArtifactState.QUARANTINED:
        raise ApiError(
            codes.ARTIFACT_QUARANTINED,
            f"Artifact {artifact.name} stays in quarantine: {artifact.quarantine_rule} still fails "
            f"({next(c['detail'] for c in artifact.checks if c['outcome'] == 'fail')}).",
            409,
        )
    return artifact


def _changed_files(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    old = {f["path"]: f["sha256"] for f in before}
    new = {f["path"]: f["sha256"] for f in after}
    changes = [f"{path} added" for path in sorted(new.keys() - old.keys())]
    changes += [f"{path} removed" for path in sorted(old.keys() - new.keys())]
    changes += [
        f"{path} {old[path][:12]}… → {new[path][:12]}…"
        for path in sorted(old.keys() & new.keys())
        if old[path] != new[path]
    ]
    return changes


def _release_unfetched(artifact: Artifact, *, by: str, reason: str) -> Artifact:
    """A source refused before download: once its rules pass (the operator changed the policy), the
    release fetches it now, and every rule runs again on what arrives."""
    if _refused_before_fetch(artifact):
        raise ApiError(
            codes.ARTIFACT_QUARANTINED,
            f"Artifact {artifact.name} stays in quarantine: {artifact.quarantine_rule} still fails "
            f"({next(c['detail'] for c in artifact.checks if c['outcome'] == 'fail')}); nothing was fetched.",
            409,
        )
    artifact.transition(
        ArtifactState.REQUESTED,
        detail=f"released by {by}: {reason}; fetching now, every check runs again on what arrives",
        by=by,
        quarantine_rule="",
    )
    from apps.artifacts.tasks import acquire as acquire_task

    send_on_commit(acquire_task, artifact.pk)
    return artifact


AMENDABLE = ("licence", "expected_sha256")


def amend(artifact: Artifact, *, by: str, reason: str, changes: dict[str, Any]) -> Artifact:
    """Correct a quarantined artifact's record (its licence, the digests it must match), recorded with
    who, why and the values before and after. It stays quarantined: only ``release`` (a fresh pass of
    every check) lets it out."""
    if artifact.state != ArtifactState.QUARANTINED:
        raise ApiError(
            codes.ARTIFACT_NOT_QUARANTINED,
            f"Artifact {artifact.name} is {artifact.state}; only a quarantined artifact's record is amended.",
            409,
        )
    if not reason.strip():
        raise ApiError("VALIDATION_ERROR", "Say why the record changes (reason).", 400)
    unknown = set(changes) - set(AMENDABLE)
    if unknown or not changes:
        raise ApiError("VALIDATION_ERROR", f"Only {', '.join(AMENDABLE)} can be amended.", 400)
    before = {name: getattr(artifact, name) for name in changes}
    for name, value in changes.items():
        setattr(artifact, name, value)
    artifact.save(update_fields=list(changes))
    artifact.events.create(
        from_state=artifact.state,
        to_state=artifact.state,
        by=by,
        detail=f"record amended: {reason.strip()}; before {before}; after {changes}",
    )
    return artifact


def discard(artifact: Artifact) -> None:
    shutil.rmtree(store_dir(artifact), ignore_errors=True)


def rehydration_refusal(artifact: Artifact) -> ApiError | None:
    """Why ``artifact`` may not be rehydrated, or None: it needs recorded files to verify against, and
    rehydration restores bytes; it is never a way out of quarantine."""
    if not artifact.files:
        return ApiError(
            codes.ARTIFACT_HAS_NO_FILES,
            f"Artifact {artifact.name} has no recorded files to verify against; it was never acquired: "
            "retry its acquisition instead.",
            409,
        )
    if artifact.state == ArtifactState.QUARANTINED:
        return ApiError(
            codes.ARTIFACT_QUARANTINED, f"Artifact {artifact.name} is quarantined; release it first.", 409
        )
    return None


def rehydrate(artifact: Artifact) -> Artifact:
    """Re-acquire the store's copy from the recorded upstream identity only, and verify it against the
    recorded digests. Anything else — the upstream gone, changed, or not matching — is
    ``ARTIFACT_REHYDRATION_BLOCKED`` with what was tried: never a fallback to another source."""
    refusal = rehydration_refusal(artifact)
    if refusal is not None:
        raise refusal
    tried = f"{artifact.source_kind} {artifact.locator}" + (
        f" at {artifact.revision}" if artifact.revision else ""
    )
    scratch = store_dir(artifact).with_name(f"{artifact.pk}.rehydrating")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        try:
            fetch(artifact, scratch)
        except local_roots.LocalSourceRefused as exc:
            return _blocked(artifact, f"tried {tried}: {codes.LOCAL_SOURCE_NOT_ALLOWED}: {exc}")
        except SourceUnreachable as exc:
            return _blocked(artifact, f"tried {tried}: {exc}")
        fresh = list(digests(scratch))
        got = {f["path"]: (f["size"], f["sha256"]) for f in fresh}
        wanted = {f["path"]: (f["size"], f["sha256"]) for f in artifact.files}
        if got != wanted:
            changed = sorted(p for p in wanted.keys() | got.keys() if got.get(p) != wanted.get(p))
            return _blocked(
                artifact,
                f"tried {tried}: the upstream no longer matches the recorded digests "
                f"({', '.join(changed[:10])})",
            )
        target = store_dir(artifact)
        shutil.rmtree(target, ignore_errors=True)
        scratch.replace(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    artifact.store_path = str(store_dir(artifact))
    artifact.failure_code, artifact.failure_message = "", ""
    artifact.files = fresh  # the same paths, sizes and SHA-256s, with BLAKE3s an older record lacked
    artifact.save(update_fields=["store_path", "failure_code", "failure_message", "files"])
    # The bytes match the record; the rules still decide whether it may be used.
    judge(artifact, run_checks(artifact), detail=f"rehydrated from {tried}, every digest verified")
    return artifact


def _blocked(artifact: Artifact, detail: str) -> Artifact:
    artifact.transition(
        ArtifactState.FAILED,
        detail=detail,
        failure_code=codes.ARTIFACT_REHYDRATION_BLOCKED,
        failure_message=detail,
    )
    return artifact
