"""A full cutover on pgvector between two capabilities served through the gateway by echo engines of two
models (the spaces really differ: 8 and 16 dimensions, other vectors), with a consumer querying the alias
the whole time; the REQUIRES_REINDEX refusals; a same-space move without a reindex."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.alerts.models import Alert
from apps.clusters.models import Capability, ClientCredential
from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace
from apps.embedding_migrations.tests.live import (
    TARGET_MODEL,
    Consumer,
    Fleet,
    build_fleet,
    serve,
    start_agent,
    stop_agent,
)
from apps.embedding_migrations.tests.stores import scratch_vector_dsn
from tests.fixtures import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def fleet(live_web, celery_worker_process, operator_client, tmp_path: Path) -> Iterator[Fleet]:
    agent = start_agent(live_web, tmp_path)
    try:
        with scratch_vector_dsn() as dsn:
            built = build_fleet(operator_client, agent, dsn, documents=1500)
            yield built
            built.adapter.close()
    finally:
        stop_agent(agent)


def stage(pk: str) -> str:
    return Cutover.objects.get(pk=pk).stage


def test_a_cutover_reindexes_through_the_gateway_and_swaps_with_no_failed_or_wrong_space_query(
    fleet: Fleet, live_web, operator_client, celery_worker_process
):
    alias = fleet.alias
    source = EmbeddingSpace.objects.get(capability__name="rag.embedding@1")
    target = EmbeddingSpace.objects.get(capability__name="rag.embedding@2")
    assert (source.model, source.dimension, source.normalized) == ("enc-a-8d", 8, True)
    assert (target.model, target.dimension) == (TARGET_MODEL, 16) and not source.same_as(target)

    # A consumer is never bound to an index of another space.
    refused = operator_client.post(
        "/api/v1/consumer-aliases",
        {
            "store": fleet.store.pk,
            "name": "kb2",
            "index": "kb_v1",
            "capability": "rag.embedding@2",
            "query_capability": "kb2.query@1",
        },
        format="json",
    )
    assert refused.status_code == 409 and refused.json()["code"] == "REQUIRES_REINDEX"
    assert source.key in refused.json()["message"] and target.key in refused.json()["message"]
    assert not Capability.objects.filter(name="kb2.query@1").exists()

    with Consumer(live_web.url, fleet.adapter, fleet.documents) as consumer:
        planned = operator_client.post(
            "/api/v1/cutovers",
            {"alias": alias.pk, "target_capability": "rag.embedding@2", "batch_size": 64},
            format="json",
        )
        assert planned.status_code == 201, planned.content
        pk = planned.json()["id"]
        assert planned.json()["same_space"] is False

        # Before the reindex is verified the swap is refused, naming both spaces.
        early = operator_client.post(f"/api/v1/cutovers/{pk}/cut", {}, format="json")
        assert early.status_code == 409 and early.json()["code"] == "REQUIRES_REINDEX"
        assert source.key in early.json()["message"] and target.key in early.json()["message"]

        started = operator_client.post(f"/api/v1/cutovers/{pk}/start", {}, format="json")
        assert started.status_code == 202, started.content
        seen_progress = []

        def ready() -> bool:
            body = operator_client.get(f"/api/v1/cutovers/{pk}").json()
            seen_progress.append(body["progress"]["documents_done"])
            # The alias stays on the source until the cut, whatever the reindex has written.
            assert fleet.adapter.read_alias_target("kb") == "kb_v1"
            return body["stage"] in ("ready_to_cut", "failed")

        assert wait_until(ready, 120, interval=0.3), celery_worker_process.log()[-3000:]
        done = Cutover.objects.get(pk=pk)
        assert done.stage == "ready_to_cut", (done.failure_code, done.failure_message, done.verification)
        assert done.docs_done == done.docs_total == fleet.documents
        assert done.verification["passed"] and set(done.verification["checks"]) >= {
            "count",
            "dimension",
            "norm",
            "re_embedded",
            "queries",
        }
        assert any(0 < n < fleet.documents for n in seen_progress)  # progress was visible on the way
        body = operator_client.get(f"/api/v1/cutovers/{pk}").json()
        assert body["progress"]["percent"] == 100.0 and body["progress"]["documents_per_second"] > 0
        # The reindex credential was scoped to exactly the target and is revoked now.
        used = ClientCredential.objects.filter(name=f"cutover {pk} reindex")
        assert used.count() == 2  # the reindex's and the verification's
        assert all(c.scopes == ["rag.embedding@2"] and c.revoked_at is not None for c in used)

        before = dict(consumer.spaces_seen)
        assert before == {source.key: before.get(source.key, 0)} and before[source.key] > 0

        cut = operator_client.post(f"/api/v1/cutovers/{pk}/cut", {"reason": "move to enc-b"}, format="json")
        assert cut.status_code == 202, cut.content
        assert wait_until(lambda: stage(pk) in ("completed", "failed"), 30)
        assert stage(pk) == "completed"
        assert fleet.adapter.read_alias_target("kb") == done.target_index
        # A query counts when it is sent and its space when it is answered: one in flight at this moment
        # may be counted in both snapshots' ways, so the later queries are measured from both.
        after_cut = consumer.queries
        target_at_cut = consumer.spaces_seen.get(target.key, 0)
        assert wait_until(lambda: consumer.spaces_seen.get(target.key, 0) > target_at_cut + 20, 30)

    assert consumer.queries >= after_cut + 20
    assert consumer.failed == [] and consumer.wrong_space == []
    assert set(consumer.spaces_seen) == {source.key, target.key}
    alias.refresh_from_db()
    assert alias.index == done.target_index and alias.capability.name == "rag.embedding@2"
    assert str(Capability.objects.get(name="kb.query@1").follows) == "rag.embedding@2"
    events = [(e.from_stage, e.to_stage) for e in Cutover.objects.get(pk=pk).events.all()]
    assert events == [
        ("", "planned"),
        ("planned", "provisioning"),
        ("provisioning", "reindexing"),
        ("reindexing", "verifying"),
        ("verifying", "ready_to_cut"),
        ("ready_to_cut", "cutting_over"),
        ("cutting_over", "completed"),
    ]
    cut_event = Cutover.objects.get(pk=pk).events.get(to_stage="cutting_over")
    assert cut_event.actor != "" and cut_event.reason == "move to enc-b"
    assert not Alert.objects.open().filter(subject_type="cutover").exists()

    # The space behind an alias's data cannot be re-recorded as another.
    changed = operator_client.post(
        "/api/v1/embedding-spaces",
        {"capability": "rag.embedding@2", "model": "something-else", "dimension": 16, "normalized": True},
        format="json",
    )
    assert changed.status_code == 409 and changed.json()["code"] == "REQUIRES_REINDEX"


def test_a_same_space_move_needs_no_reindex(fleet: Fleet, operator_client):
    # Another capability version served by the same model: the same space.
    # Recorded when it was bound (the probe of a new binding), not measured by hand.
    serve(operator_client, "rag.embedding@3", "enc-a-2", "enc-a-8d", measure=False)
    assert wait_until(lambda: EmbeddingSpace.objects.filter(capability__name="rag.embedding@3").exists(), 30)
    assert EmbeddingSpace.objects.get(capability__name="rag.embedding@3").recorded_by == "probe by binding"
    assert EmbeddingSpace.objects.get(capability__name="rag.embedding@3").same_as(
        EmbeddingSpace.objects.get(capability__name="rag.embedding@1")
    )
    planned = operator_client.post(
        "/api/v1/cutovers", {"alias": fleet.alias.pk, "target_capability": "rag.embedding@3"}, format="json"
    )
    assert planned.status_code == 201 and planned.json()["same_space"] is True
    pk = planned.json()["id"]
    # Only one open cutover per alias.
    second = operator_client.post(
        "/api/v1/cutovers", {"alias": fleet.alias.pk, "target_capability": "rag.embedding@2"}, format="json"
    )
    assert second.status_code == 409 and second.json()["code"] == "CUTOVER_IN_PROGRESS"
    started = operator_client.post(f"/api/v1/cutovers/{pk}/start", {}, format="json")
    assert started.json()["stage"] == "ready_to_cut"
    assert operator_client.post(f"/api/v1/cutovers/{pk}/cut", {}, format="json").status_code == 202
    assert wait_until(lambda: stage(pk) == "completed", 30)
    cutover = Cutover.objects.get(pk=pk)
    assert cutover.target_index == "kb_v1" and cutover.docs_done == 0
    assert fleet.adapter.list_indexes()[0].name == "kb_v1" and len(fleet.adapter.list_indexes()) == 1
    alias = ConsumerAlias.objects.get(pk=fleet.alias.pk)
    assert alias.capability.name == "rag.embedding@3" and alias.index == "kb_v1"
