"""The cutover with a real engine: from the echo engine's space into llama.cpp's embeddings of the Gemma
3 270M GGUF (640 dimensions), reindexed through the gateway and verified, with a consumer querying the
alias the whole time. Runs where the engine is installed (make test builds it once and caches it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from apps.clusters.models import Capability, RoutingTier
from apps.embedding_migrations.models import Cutover, EmbeddingSpace
from apps.embedding_migrations.tests.live import Consumer, Fleet, build_fleet, start_agent, stop_agent
from apps.embedding_migrations.tests.stores import scratch_vector_dsn
from apps.servers.models import ModelServer
from tests.fixtures import wait_until

pytestmark = [
    pytest.mark.engine,
    pytest.mark.stack,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("MODELFORGE_TEST_ENGINES") != "1", reason="real engines run under `make test-engines`"
    ),
]


@pytest.fixture
def fleet(live_web, celery_worker_process, operator_client, tmp_path: Path, settings) -> Iterator[Fleet]:
    pytest.importorskip("llama_cpp", reason="`make engines` installs llama-cpp-python")
    agent = start_agent(
        live_web, tmp_path, lambda models: call_command("install_demo_gguf", models_dir=models)
    )
    settings.LOCAL_NODE = "cutover-node"  # GGUF servers run on the local node only
    try:
        with scratch_vector_dsn() as dsn:
            built = build_fleet(operator_client, agent, dsn, documents=96)
            yield built
            built.adapter.close()
    finally:
        stop_agent(agent)


def test_a_cutover_into_a_real_engine_s_space(fleet: Fleet, live_web, operator_client, tmp_path: Path):
    (gguf,) = (tmp_path / "models").glob("*.gguf")
    created = operator_client.post(
        "/api/v1/servers",
        {
            "name": "gemma-embed",
            "profile": "llamacpp-gemma-embeddings",
            "model": gguf.name,
            "weights_bytes": gguf.stat().st_size,
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert wait_until(lambda: _server_state("gemma-embed") in ("running", "failed"), 240)
    server = ModelServer.objects.get(name="gemma-embed")
    assert server.state == "running", (server.failure_code, server.failure_message)
    capability = Capability.objects.create(name="rag.embedding@9")
    RoutingTier.objects.create(capability=capability, server=server)
    measured = operator_client.post(
        "/api/v1/embedding-spaces/measure", {"capability": capability.name}, format="json"
    )
    assert measured.status_code == 201, measured.content
    space = EmbeddingSpace.objects.get(capability__name="rag.embedding@9")
    assert space.model == gguf.name and space.dimension == 640

    with Consumer(live_web.url, fleet.adapter, fleet.documents) as consumer:
        planned = operator_client.post(
            "/api/v1/cutovers",
            {"alias": fleet.alias.pk, "target_capability": "rag.embedding@9", "batch_size": 16},
            format="json",
        )
        assert planned.status_code == 201, planned.content
        pk = planned.json()["id"]
        assert operator_client.post(f"/api/v1/cutovers/{pk}/start", {}, format="json").status_code == 202
        assert wait_until(lambda: Cutover.objects.get(pk=pk).stage in ("ready_to_cut", "failed"), 600)
        done = Cutover.objects.get(pk=pk)
        assert done.stage == "ready_to_cut", (done.failure_code, done.failure_message, done.verification)
        assert done.verification["passed"] and done.docs_done == fleet.documents
        assert operator_client.post(f"/api/v1/cutovers/{pk}/cut", {}, format="json").status_code == 202
        assert wait_until(lambda: Cutover.objects.get(pk=pk).stage == "completed", 60)
        assert wait_until(lambda: consumer.spaces_seen.get(space.key, 0) >= 5, 120)
    assert consumer.failed == [] and consumer.wrong_space == []
    assert fleet.adapter.info(done.target_index).dimension == 640


def _server_state(name: str) -> str:
    found = ModelServer.objects.filter(name=name).first()
    return found.state if found else ""
