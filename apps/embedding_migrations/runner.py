"""The stage runner: a Celery task's body, working a claimed run through provisioning, reindexing,
verifying and cutting over. The store is touched only through the alias's adapter; every batch beats the
run's heartbeat and checks the run is still its own (a roll back or a retry takes it back)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.clusters.models import ClientCredential
from apps.embedding_migrations import codes
from apps.embedding_migrations.adapters.base import AdapterError, Row
from apps.embedding_migrations.choices import Stage
from apps.embedding_migrations.models import Cutover
from apps.embedding_migrations.records import SUBJECT, LostRun, lock_cutover, move, switch_books
from apps.embedding_migrations.spaces import is_vector, norm

logger = logging.getLogger(__name__)


VERIFY_SAMPLE = 32


# A re-embedded sample must match what was stored (cosine similarity; rounding of the engine's JSON).
SAME_VECTOR = 0.9999


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    na, nb = norm(a), norm(b)
    if na == 0 or nb == 0 or len(a) != len(b):
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def claim(cutover_id: str, token: str) -> bool:
    now = timezone.now()
    return bool(
        Cutover.objects.filter(pk=cutover_id, run_token=token, claimed_at__isnull=True).update(
            claimed_at=now, heartbeat_at=now
        )
    )


def _beat(cutover: Cutover, **fields: Any) -> None:
    """Record progress; raises LostRun when the run is no longer this one's."""
    updated = Cutover.objects.filter(
        pk=cutover.pk, run_token=cutover.run_token, interrupted_at__isnull=True
    ).update(heartbeat_at=timezone.now(), **fields)
    if not updated:
        raise LostRun()


class Pulse:
    """Beats the run's heartbeat from a thread while one long store statement runs (an HNSW build, a
    slow batch); it dies with the process, so a killed worker still goes silent."""

    def __init__(self, cutover_id: str, token: str) -> None:
        self.cutover_id, self.token = cutover_id, token
        self.stop = threading.Event()
        self.every = max(1.0, settings.CUTOVER_STALL_AFTER / 4)
        self.thread = threading.Thread(target=self._beat, name=f"cutover-pulse-{cutover_id}", daemon=True)

    def __enter__(self) -> Pulse:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _beat(self) -> None:
        try:
            while not self.stop.wait(self.every):
                try:
                    Cutover.objects.filter(
                        pk=self.cutover_id, run_token=self.token, interrupted_at__isnull=True
                    ).update(heartbeat_at=timezone.now())
                except DatabaseError:
                    close_old_connections()
        finally:
            connection.close()


def run(cutover_id: str, token: str) -> str:
    """Run the cutover's stage and the ones after it up to ready_to_cut (or completed, for a cut)."""
    if not claim(cutover_id, token):
        logger.info("cutover %s run %s already claimed or replaced: nothing to do", cutover_id, token)
        return "not claimed"
    cutover = Cutover.objects.select_related("alias__store", "target_capability").get(pk=cutover_id)
    try:
        with Pulse(cutover_id, token), cutover.alias.store.adapter() as adapter:
            while True:
                if cutover.stage == Stage.PROVISIONING:
                    _provision(cutover, adapter)
                    _advance(cutover, Stage.REINDEXING, "provisioned")
                elif cutover.stage == Stage.REINDEXING:
                    _reindex(cutover, adapter)
                    _advance(cutover, Stage.VERIFYING, "reindexed")
                elif cutover.stage == Stage.VERIFYING:
                    if not _verify(cutover, adapter):
                        return _fail(cutover, codes.VERIFICATION_FAILED, _verification_summary(cutover))
                    _advance(cutover, Stage.READY_TO_CUT, "verified")
                    return Stage.READY_TO_CUT
                elif cutover.stage == Stage.CUTTING_OVER:
                    _cut_over(cutover, adapter)
                    return Stage.COMPLETED
                else:
                    return str(cutover.stage)
    except LostRun:
        logger.info("cutover %s: run %s was taken back; stopped", cutover_id, token)
        return "lost"
    except AdapterError as exc:
        return _fail(cutover, exc.code, exc.message)
    except EmbeddingFailed as exc:
        return _fail(cutover, codes.EMBEDDING_FAILED, str(exc))
    finally:
        revoke_credentials(cutover)


def _advance(cutover: Cutover, to: str, reason: str) -> None:
    with transaction.atomic():
        locked = lock_cutover(cutover.pk)
        if locked.run_token != cutover.run_token or locked.interrupted:
            raise LostRun()
        move(locked, to, actor="worker", reason=reason, heartbeat_at=timezone.now())
    cutover.refresh_from_db()


def _fail(cutover: Cutover, code: str, message: str) -> str:
    with transaction.atomic():
        locked = lock_cutover(cutover.pk)
        if locked.run_token != cutover.run_token or locked.interrupted:
            return "lost"
        stage = locked.stage
        move(
            locked,
            Stage.FAILED,
            actor="worker",
            reason=f"{code}: {message}",
            failure_code=code,
            failure_message=message,
            failed_in=stage,
            run_token=None,
        )
        Alert.objects.raise_alert(
            codes.CUTOVER_FAILED,
            Severity.WARNING,
            SUBJECT,
            str(locked.pk),
            str(locked.alias),
            f"Cutover of {locked.alias} failed in {stage}: [{code}] {message} "
            "The alias still points where the "
            "store says (see the cutover's page); retry the stage or roll back.",
        )
    return Stage.FAILED


def _provision(cutover: Cutover, adapter: Any) -> None:
    adapter.create_target(
        cutover.target_index,
        dimension=int(cutover.target_space["dimension"]),
        space=cutover.target_space["key"],
    )
    _beat(cutover, docs_total=adapter.count(cutover.source_index))


class EmbeddingFailed(Exception):
    pass


# A credential minted a moment ago reaches the gateway's routing table within a few seconds.
NEW_CREDENTIAL_GRACE_S = 15.0


def gateway_base() -> str:
    """MODELFORGE_GATEWAY_URL, with or without a trailing ``/v1``."""
    base = str(settings.GATEWAY_URL).rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class GatewayEmbedder:
    """Embeds through the gateway with a credential scoped to exactly the target capability, so
    placement, balancing and scopes apply to the reindex like to any client."""

    def __init__(self, capability: str, secret: str) -> None:
        self.capability = capability
        self.born = time.monotonic()
        self.client = httpx.Client(
            base_url=gateway_base(),
            headers={"Authorization": f"Bearer {secret}"},
            timeout=httpx.Timeout(60.0, connect=5.0),
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        last = ""
        attempt = 0
        while attempt < 4:
            try:
                answer = self.client.post(
                    "/v1/embeddings", json={"model": self.capability, "input": list(texts)}
                )
            except httpx.HTTPError as exc:
                last = f"the gateway could not be reached ({type(exc).__name__})"
            else:
                if answer.status_code == 200:
                    data = sorted(answer.json()["data"], key=lambda item: item["index"])
                    if len(data) != len(texts):
                        raise EmbeddingFailed(f"asked for {len(texts)} vectors, got {len(data)}")
                    vectors = [item["embedding"] for item in data]
                    if not all(is_vector(v) for v in vectors):
                        raise EmbeddingFailed(
                            "the gateway answered something other than one vector per input"
                        )
                    return vectors
                last = f"HTTP {answer.status_code}: {answer.text[:300]}"
                if answer.status_code == 401 and time.monotonic() - self.born < NEW_CREDENTIAL_GRACE_S:
                    time.sleep(0.25)  # not in the gateway's table yet
                    continue
                if answer.status_code < 500 and answer.status_code != 429:
                    break
            time.sleep(min(2**attempt, 8))
            attempt += 1
        raise EmbeddingFailed(f"the gateway did not embed a batch for {self.capability}: {last}")

    def close(self) -> None:
        self.client.close()


def _mint(cutover: Cutover) -> str:
    revoke_credentials(cutover)
    credential, plain = ClientCredential.objects.mint(
        name=f"cutover {cutover.pk} reindex", scopes=[cutover.target_capability.name]
    )
    Cutover.objects.filter(pk=cutover.pk).update(credential=credential)
    cutover.credential = credential
    return plain


def revoke_credentials(cutover: Cutover) -> None:
    for credential in ClientCredential.objects.filter(
        name=f"cutover {cutover.pk} reindex", revoked_at__isnull=True
    ):
        credential.revoke()


def _reindex(cutover: Cutover, adapter: Any) -> None:
    """Re-embed every source document into the target, batch by batch, from the recorded cursor."""
    embedder = GatewayEmbedder(cutover.target_capability.name, _mint(cutover))
    dimension = int(cutover.target_space["dimension"])
    started = timezone.now()
    _beat(cutover, reindex_started_at=cutover.reindex_started_at or started)
    try:
        cursor = cutover.cursor or None
        while True:
            began = time.monotonic()
            documents = adapter.read_documents(cutover.source_index, after=cursor, limit=cutover.batch_size)
            if not documents:
                break
            vectors = embedder.embed([d.content for d in documents])
            bad = next((v for v in vectors if len(v) != dimension), None)
            if bad is not None:
                raise EmbeddingFailed(
                    f"the gateway answered a vector of {len(bad)} dimensions; "
                    f"the target space has {dimension}"
                )
            adapter.write_vectors(
                cutover.target_index,
                [Row(d.id, d.content, v) for d, v in zip(documents, vectors, strict=True)],
            )
            cursor = documents[-1].id
            _beat(
                cutover,
                cursor=cursor,
                docs_done=F("docs_done") + len(documents),
                reindex_seconds=F("reindex_seconds") + (time.monotonic() - began),
            )
    finally:
        embedder.close()
        revoke_credentials(cutover)


def _verify(cutover: Cutover, adapter: Any) -> bool:
    """Counts, dimension, norms, a re-embedded sample, and sample queries through a verification alias."""
    target = cutover.target_space
    source_count = adapter.count(cutover.source_index)
    info = adapter.info(cutover.target_index)
    checks: dict[str, Any] = {
        "count": {"source": source_count, "target": info.count, "passed": source_count == info.count},
        "dimension": {
            "expected": target["dimension"],
            "index": info.dimension,
            "passed": info.dimension == target["dimension"] and info.space == target["key"],
        },
    }
    sample = adapter.sample(cutover.target_index, n=min(VERIFY_SAMPLE, info.count), seed=7)
    if target["normalized"]:
        off = [r.id for r in sample if abs(norm(r.embedding) - 1.0) > 1e-3]
        checks["norm"] = {"checked": len(sample), "not_unit": off[:10], "passed": not off}
    embedder = GatewayEmbedder(cutover.target_capability.name, _mint(cutover))
    try:
        fresh = embedder.embed([r.content for r in sample]) if sample else []
    finally:
        embedder.close()
        revoke_credentials(cutover)
    differing = [r.id for r, v in zip(sample, fresh, strict=True) if _cosine(r.embedding, v) < SAME_VECTOR]
    checks["re_embedded"] = {"checked": len(sample), "differing": differing[:10], "passed": not differing}
    _beat(cutover)
    probe_alias = f"mfv_{cutover.pk.hex[:20]}"
    unanswered: list[str] = []
    missed: list[str] = []
    queried = sample[:8]
    try:
        adapter.swap_alias(probe_alias, cutover.target_index, expected=adapter.read_alias_target(probe_alias))
        for row in queried:
            hits = adapter.search(probe_alias, row.embedding, space=target["key"], k=3)
            if not hits:
                unanswered.append(row.id)
            elif row.id not in {h.id for h in hits}:
                missed.append(row.id)
    finally:
        adapter.drop_alias(probe_alias)
    # Every query must answer in the target space. The search index is approximate (HNSW): a document
    # may miss its own top 3 on data without structure, so recall is reported and must only be at least
    # half (an index built over the wrong vectors finds none).
    found = len(queried) - len(unanswered) - len(missed)
    checks["queries"] = {
        "checked": len(queried),
        "unanswered": unanswered,
        "missed": missed,
        "found_themselves": found,
        "passed": not unanswered and found * 2 >= len(queried),
    }
    passed = all(c["passed"] for c in checks.values())
    _beat(cutover, verification={"passed": passed, "checks": checks, "at": timezone.now().isoformat()})
    cutover.verification = {"passed": passed, "checks": checks}
    return passed


def _verification_summary(cutover: Cutover) -> str:
    failed = [name for name, c in cutover.verification.get("checks", {}).items() if not c["passed"]]
    return f"verification failed: {', '.join(failed)} (details on the cutover's page)."


def _cut_over(cutover: Cutover, adapter: Any) -> None:
    """Swap the store's alias (compare-and-swap from the source), then the books, in that order; a crash
    between the two leaves the store swapped and the stage cutting_over: the review shows it."""
    actual = adapter.read_alias_target(cutover.alias.name)
    if actual != cutover.target_index:
        adapter.swap_alias(cutover.alias.name, cutover.target_index, expected=cutover.source_index)
    _beat(cutover)
    with transaction.atomic():
        locked = lock_cutover(cutover.pk)
        if locked.run_token != cutover.run_token or locked.interrupted:
            raise LostRun()
        switch_books(locked, locked.target_capability, locked.target_index)
        move(locked, Stage.COMPLETED, actor="worker", reason="cut over", completed_at=timezone.now())
    cutover.refresh_from_db()
