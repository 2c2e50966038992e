"""The cutover engine's refusals and operator actions on a real pgvector store, without a fleet: spaces
are declared, indexes written with the adapter, and the stage a crash would leave is set up directly."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agent.engines.echo import vector
from apps.alerts.models import Alert
from apps.clusters.models import Capability
from apps.embedding_migrations import engine, runner, spaces
from apps.embedding_migrations.adapters.base import Row
from apps.embedding_migrations.adapters.pgvector import PgvectorAdapter
from apps.embedding_migrations.choices import Stage
from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace, VectorStore
from apps.embedding_migrations.tests.stores import scratch_vector_dsn

pytestmark = pytest.mark.django_db


@pytest.fixture
def store() -> Iterator[tuple[VectorStore, PgvectorAdapter]]:
    with scratch_vector_dsn() as dsn:
        adapter = PgvectorAdapter(dsn)
        yield VectorStore.objects.create(name="s", kind="pgvector", dsn=dsn), adapter
        adapter.close()


def space(name: str, model: str, dimension: int) -> EmbeddingSpace:
    capability = Capability.objects.create(name=name)
    return spaces.record_space(
        capability,
        {"model": model, "revision": "", "dimension": dimension, "normalized": True, "pooling": "mean"},
        actor="test",
    )


@pytest.fixture
def alias(store) -> ConsumerAlias:
    found, adapter = store
    source = space("rag.embedding@1", "enc-a-8d", 8)
    space("rag.embedding@2", "enc-b-16d", 16)
    adapter.create_target("kb_v1", dimension=8, space=source.key)
    adapter.write_vectors(
        "kb_v1", [Row(f"d{i}", f"text {i}", vector(f"text {i}", "enc-a-8d", 8)) for i in range(20)]
    )
    return engine.create_alias(
        store=found,
        name="kb",
        index="kb_v1",
        capability=source.capability,
        query_capability="kb.query@1",
        actor="test",
    )


def test_spaces_are_the_same_only_when_all_five_parts_match():
    a = space("a.embed@1", "m", 8)
    b = space("b.embed@1", "m", 8)
    assert a.same_as(b) and a.key == b.key
    for change in (
        {"revision": "r2"},
        {"dimension": 9},
        {"normalized": False},
        {"pooling": "cls"},
        {"model": "n"},
    ):
        other = EmbeddingSpace(**{**a.identity(), **change})
        assert not a.same_as(other) and other.key != a.key


def test_the_query_name_follows_the_alias_capability_and_routing_serves_it_with_its_space(alias):
    from apps.gateway.routing import build_table

    query = Capability.objects.get(name="kb.query@1")
    assert str(query.follows) == "rag.embedding@1"
    table = build_table()
    assert (
        table.spaces["kb.query@1"] == table.spaces["rag.embedding@1"] == alias.capability.embedding_space.key
    )
    assert table.bindings["kb.query@1"] == table.bindings.get("rag.embedding@1", [])


def test_a_cutover_stage_that_does_not_allow_an_action_is_a_named_conflict(alias, operator_client):
    cutover = engine.plan(alias=alias, target=Capability.objects.get(name="rag.embedding@2"), actor="t")
    for action in ("complete", "retry"):
        answer = operator_client.post(
            f"/api/v1/cutovers/{cutover.pk}/{action}", {"reason": "x"}, format="json"
        )
        assert answer.status_code == 409 and answer.json()["code"] == "CUTOVER_STAGE_CONFLICT", action
    # complete / roll-back / retry need a reason; start and cut do not.
    no_reason = operator_client.post(f"/api/v1/cutovers/{cutover.pk}/roll-back", {}, format="json")
    assert no_reason.status_code == 400 and no_reason.json()["code"] == "VALIDATION_ERROR"
    # A swap under running work is never allowed: roll back waits for a cut-over in progress.
    Cutover.objects.filter(pk=cutover.pk).update(stage=Stage.CUTTING_OVER)
    busy = operator_client.post(f"/api/v1/cutovers/{cutover.pk}/roll-back", {"reason": "x"}, format="json")
    assert busy.status_code == 409 and busy.json()["code"] == "CUTOVER_STAGE_CONFLICT"


def test_an_unverified_target_is_refused_even_when_recorded_ready(alias):
    cutover = engine.plan(alias=alias, target=Capability.objects.get(name="rag.embedding@2"), actor="t")
    Cutover.objects.filter(pk=cutover.pk).update(stage=Stage.READY_TO_CUT, verification={"passed": False})
    with pytest.raises(engine.ApiError) as refused:
        engine.cut(cutover.pk, actor="t")
    assert refused.value.code == "REQUIRES_REINDEX"
    assert cutover.source_space["key"] in refused.value.message
    assert cutover.target_space["key"] in refused.value.message


def test_complete_after_a_crash_between_the_store_swap_and_the_books(alias, store):
    """The store was swapped, then the worker died before recording it: complete reads the store and
    switches the books (alias, query name) to match."""
    _, adapter = store
    target = Capability.objects.get(name="rag.embedding@2")
    cutover = engine.plan(alias=alias, target=target, actor="t")
    adapter.create_target(cutover.target_index, dimension=16, space=cutover.target_space["key"])
    adapter.swap_alias("kb", cutover.target_index, expected="kb_v1")
    Cutover.objects.filter(pk=cutover.pk).update(stage=Stage.CUTTING_OVER, interrupted_at=timezone.now())
    reading = engine.store_reading(Cutover.objects.get(pk=cutover.pk))
    assert reading["alias_target"] == cutover.target_index and reading["target"]["dimension"] == 16
    engine.complete(cutover.pk, actor="operator-1", reason="the store shows the target")
    done = Cutover.objects.get(pk=cutover.pk)
    assert done.stage == "completed" and not done.interrupted
    alias.refresh_from_db()
    assert alias.index == cutover.target_index and alias.capability == target
    assert Capability.objects.get(name="kb.query@1").follows == target
    event = done.events.last()
    assert event is not None and (event.actor, event.reason) == ("operator-1", "the store shows the target")


def test_roll_back_after_an_interrupted_swap_puts_the_store_and_the_books_on_the_source(alias, store):
    _, adapter = store
    cutover = engine.plan(alias=alias, target=Capability.objects.get(name="rag.embedding@2"), actor="t")
    adapter.create_target(cutover.target_index, dimension=16, space=cutover.target_space["key"])
    adapter.swap_alias("kb", cutover.target_index, expected="kb_v1")
    Cutover.objects.filter(pk=cutover.pk).update(stage=Stage.CUTTING_OVER, interrupted_at=timezone.now())
    engine.roll_back(cutover.pk, actor="operator-1", reason="back to the source")
    assert adapter.read_alias_target("kb") == "kb_v1"
    assert adapter.exists(cutover.target_index)  # kept for inspection
    assert Cutover.objects.get(pk=cutover.pk).stage == "rolled_back"
    assert str(Capability.objects.get(name="kb.query@1").follows) == "rag.embedding@1"


def test_the_watch_marks_a_silent_run_interrupted_and_sends_an_unclaimed_run_again(alias, settings):
    settings.CUTOVER_STALL_AFTER = 60
    target = Capability.objects.get(name="rag.embedding@2")
    silent = engine.plan(alias=alias, target=target, actor="t")
    long_ago = timezone.now() - timedelta(minutes=5)
    Cutover.objects.filter(pk=silent.pk).update(
        stage=Stage.REINDEXING, run_token=silent.pk, claimed_at=long_ago, heartbeat_at=long_ago
    )
    with mock.patch("apps.embedding_migrations.engine.send_on_commit") as sent:
        assert engine.watch() == {"interrupted": 1, "resent": 0}
        assert engine.watch() == {"interrupted": 0, "resent": 0}  # once
    assert not sent.called
    assert Cutover.objects.get(pk=silent.pk).stage == "reindexing"
    assert Alert.objects.open().filter(code="CUTOVER_INTERRUPTED", subject_id=str(silent.pk)).count() == 1

    # Never claimed (the message was lost before any worker took it): sent again, nothing marked.
    Cutover.objects.filter(pk=silent.pk).update(
        stage=Stage.PROVISIONING, interrupted_at=None, claimed_at=None, stage_since=long_ago
    )
    with mock.patch("apps.embedding_migrations.engine.send_on_commit") as sent:
        assert engine.watch() == {"interrupted": 0, "resent": 1}
    assert sent.call_args.args[1:] == (str(silent.pk), str(silent.pk))


def test_a_run_whose_token_is_not_the_cutover_s_does_nothing(alias):
    cutover = engine.plan(alias=alias, target=Capability.objects.get(name="rag.embedding@2"), actor="t")
    Cutover.objects.filter(pk=cutover.pk).update(stage=Stage.PROVISIONING, run_token=cutover.pk)
    assert runner.run(str(cutover.pk), "00000000-0000-0000-0000-000000000000") == "not claimed"
    assert Cutover.objects.get(pk=cutover.pk).claimed_at is None


def test_bad_input_is_a_named_400_and_nothing_is_written(alias, store, operator_client):
    found, _ = store
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/api/v1/cutovers", {"alias": alias.pk, "target_capability": "rag.embedding@2", "batch_size": 0}),
        ("/api/v1/cutovers", {"alias": alias.pk, "target_capability": "kb.query@1"}),
        ("/api/v1/cutovers", {"alias": 999999, "target_capability": "rag.embedding@2"}),
        (
            "/api/v1/consumer-aliases",
            {
                "store": found.pk,
                "name": "Bad-Name",
                "index": "kb_v1",
                "capability": "rag.embedding@1",
                "query_capability": "q.query@1",
            },
        ),
        (
            "/api/v1/consumer-aliases",
            {
                "store": found.pk,
                "name": "kb3",
                "index": "kb_v1",
                "capability": "rag.embedding@1",
                "query_capability": "kb.query@1",
            },
        ),
        (
            "/api/v1/vector-stores",
            {"name": "x", "kind": "pgvector", "dsn": "postgresql://postgres@127.0.0.1:1/x"},
        ),
        ("/api/v1/vector-stores", {"name": "y", "kind": "faiss", "dsn": "postgresql://x"}),
        (
            "/api/v1/embedding-spaces",
            {"capability": "rag.embedding@1", "model": "m", "dimension": 0, "normalized": True},
        ),
    ]
    before = (Cutover.objects.count(), ConsumerAlias.objects.count(), VectorStore.objects.count())
    for url, body in cases:
        answer = operator_client.post(url, body, format="json")
        assert answer.status_code == 400, (url, body, answer.content)
        # A row that does not exist (alias 999999) is named as such (modelforge.errors.STATE_REFUSALS).
        assert answer.json()["code"] in (
            "VALIDATION_ERROR",
            "STORE_UNAVAILABLE",
            "REFERENCE_NOT_FOUND",
        ), answer.content
    assert (Cutover.objects.count(), ConsumerAlias.objects.count(), VectorStore.objects.count()) == before
    unreachable = operator_client.post("/api/v1/vector-stores", cases[5][1], format="json")
    assert unreachable.json()["code"] == "STORE_UNAVAILABLE"
    # Measuring a capability with no running backend is named, not a 500.
    unmeasured = operator_client.post(
        "/api/v1/embedding-spaces/measure", {"capability": "rag.embedding@2"}, format="json"
    )
    assert unmeasured.status_code == 409 and unmeasured.json()["code"] == "EMBEDDING_SPACE_UNKNOWN"
    # An application's first index: created empty in a capability's space, listed, refused twice over.
    made = operator_client.post(
        f"/api/v1/vector-stores/{found.pk}/indexes",
        {"name": "faq_v1", "capability": "rag.embedding@2"},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert made.json() == {
        "name": "faq_v1",
        "space": EmbeddingSpace.objects.get(capability__name="rag.embedding@2").key,
        "dimension": 16,
        "count": 0,
    }
    clash = operator_client.post(
        f"/api/v1/vector-stores/{found.pk}/indexes",
        {"name": "faq_v1", "capability": "rag.embedding@1"},
        format="json",
    )
    assert clash.status_code == 409 and clash.json()["code"] == "INDEX_EXISTS"
    listed = operator_client.get(f"/api/v1/vector-stores/{found.pk}/indexes").json()
    assert {i["name"] for i in listed} == {"kb_v1", "faq_v1"}
    # A capability behind an alias cannot be deleted from under it.
    held = Capability.objects.get(name="rag.embedding@1")
    deleted = operator_client.delete(f"/api/v1/capabilities/{held.pk}")
    assert deleted.status_code == 409 and deleted.json()["code"] == "CONFLICT", deleted.content
    assert "kb" in deleted.json()["message"]
    # The store's connection string is never shown back.
    listed = operator_client.get("/api/v1/vector-stores").json()
    assert "dsn" not in str(listed)


def test_the_dashboard_lists_plans_and_acts_on_cutovers(alias, store):
    admin = User.objects.create_superuser("dash", "d@example.com", "a-long-dashboard-password")
    client = Client()
    client.force_login(admin)
    page = client.get("/migrations/")
    assert page.status_code == 200 and "kb.query@1" in page.content.decode()
    planned = client.post("/migrations/plan", {"alias": alias.pk, "target_capability": "rag.embedding@2"})
    assert planned.status_code == 302
    cutover = Cutover.objects.get()
    detail = client.get(f"/migrations/{cutover.pk}/").content.decode()
    assert 'role="progressbar"' in detail and "kb_v1" in detail and "planned" in detail
    # Cut before the reindex: refused with its name, shown on the page.
    refused = client.post(f"/migrations/{cutover.pk}/cut", follow=True).content.decode()
    assert "REQUIRES_REINDEX" in refused
    # An action that needs a reason refuses without one.
    no_reason = client.post(
        f"/migrations/{cutover.pk}/roll-back", {"reason": ""}, follow=True
    ).content.decode()
    assert "VALIDATION_ERROR" in no_reason and Cutover.objects.get().stage == "planned"
    client.post(f"/migrations/{cutover.pk}/roll-back", {"reason": "not now"})
    assert Cutover.objects.get().stage == "rolled_back"
    assert client.post("/migrations/plan", {"alias": "x", "target_capability": "nope"}).status_code == 302
    assert client.get("/migrations/?stage=rolled_back").status_code == 200
    assert client.get("/admin/embedding_migrations/cutover/").status_code == 200
    assert client.get(f"/admin/embedding_migrations/cutover/{cutover.pk}/review/").status_code == 200
