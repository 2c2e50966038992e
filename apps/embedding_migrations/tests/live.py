"""A small real fleet for cutover tests: one agent running echo engines of two embedding models, their
capabilities bound, a scratch pgvector store holding a source index embedded by the first model, and a
consumer alias over it."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

from agent.engines.echo import vector
from apps.clusters.models import Capability, ClientCredential, RoutingTier
from apps.embedding_migrations.adapters.base import Row
from apps.embedding_migrations.adapters.pgvector import PgvectorAdapter
from apps.embedding_migrations.models import ConsumerAlias, VectorStore
from apps.nodes.models import EnrollmentToken, Node
from apps.servers.models import ModelServer
from tests.fixtures import PYTHON, RunningProcess, agent_environment, start_process, wait_until

SOURCE_MODEL, TARGET_MODEL = "enc-a-8d", "enc-b-16d"
# The consumer's contract (docs/operations/RUNBOOK_MIGRATION_FAILURE.md): an empty answer in the space
# the gateway named means the alias just moved; embed again after a pause, for up to a few seconds.
TRIES, RETRY_PAUSE_S = 20, 0.2


def document(i: int) -> str:
    return f"document {i:06d}: the quick brown fox number {i} jumps"


@dataclass
class Fleet:
    agent: RunningProcess
    store: VectorStore
    adapter: PgvectorAdapter
    alias: ConsumerAlias
    documents: int


def start_agent(
    live_web: Any, tmp_path: Path, prepare: Callable[[Path], object] | None = None
) -> RunningProcess:
    models = tmp_path / "models"
    for name in (SOURCE_MODEL, TARGET_MODEL):
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text("{}")
    if prepare is not None:
        prepare(models)
    _, token = EnrollmentToken.objects.mint(note="cutover tests")
    env = agent_environment(
        live_web.url,
        tmp_path / "state",
        secret=str(settings.CLUSTER_SECRET),
        name="cutover-node",
        token=token,
        models=models,
    )
    agent = start_process([PYTHON, "-m", "agent"], env, tmp_path / "agent.log")
    assert wait_until(lambda: Node.objects.filter(liveness="online").exists(), 40), agent.log()[-2000:]
    return agent


def stop_agent(agent: RunningProcess) -> None:
    if agent.process.poll() is None:
        os.killpg(agent.process.pid, signal.SIGTERM)
        agent.process.wait(20)


def serve(
    operator_client: Any, capability: str, server: str, model: str, *, measure: bool = True
) -> Capability:
    created = operator_client.post(
        "/api/v1/servers", {"name": server, "profile": "test-echo", "model": model}, format="json"
    )
    assert created.status_code == 201, created.content
    assert wait_until(lambda: ModelServer.objects.filter(name=server, state="running").exists(), 60)
    found = Capability.objects.create(name=capability)
    RoutingTier.objects.create(capability=found, server=ModelServer.objects.get(name=server))
    if measure:
        measured = operator_client.post(
            "/api/v1/embedding-spaces/measure", {"capability": capability}, format="json"
        )
        assert measured.status_code == 201, measured.content
    return found


def build_fleet(operator_client: Any, agent: RunningProcess, dsn: str, documents: int) -> Fleet:
    serve(operator_client, "rag.embedding@1", "enc-a-1", SOURCE_MODEL)
    serve(operator_client, "rag.embedding@2", "enc-b-1", TARGET_MODEL)
    registered = operator_client.post(
        "/api/v1/vector-stores", {"name": "kb-store", "kind": "pgvector", "dsn": dsn}, format="json"
    )
    assert registered.status_code == 201, registered.content
    store = VectorStore.objects.get(name="kb-store")
    adapter = PgvectorAdapter(dsn)
    space = Capability.objects.get(name="rag.embedding@1").embedding_space
    adapter.create_target("kb_v1", dimension=8, space=space.key)
    rows = [Row(f"d{i:06d}", document(i), vector(document(i), SOURCE_MODEL, 8)) for i in range(documents)]
    for start in range(0, documents, 500):
        adapter.write_vectors("kb_v1", rows[start : start + 500])
    bound = operator_client.post(
        "/api/v1/consumer-aliases",
        {
            "store": store.pk,
            "name": "kb",
            "index": "kb_v1",
            "capability": "rag.embedding@1",
            "query_capability": "kb.query@1",
        },
        format="json",
    )
    assert bound.status_code == 201, bound.content
    return Fleet(agent, store, adapter, ConsumerAlias.objects.get(name="kb"), documents)


@dataclass
class Consumer:
    """An application querying the alias the whole time: it embeds each query through the gateway with
    the alias's query name and searches the alias in the space the gateway says the vector is in."""

    gateway: str
    adapter: PgvectorAdapter
    documents: int
    secret: str = ""
    queries: int = 0
    retried: int = 0
    failed: list[str] = field(default_factory=list)
    wrong_space: list[str] = field(default_factory=list)
    spaces_seen: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        _, self.secret = ClientCredential.objects.mint(name="kb consumer", scopes=["kb.query@1"])
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Consumer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def _loop(self) -> None:
        rng = random.Random(11)
        with httpx.Client(base_url=self.gateway, timeout=10) as client:
            while not self.stop.is_set():
                i = rng.randrange(self.documents)
                self._query(client, i)
                time.sleep(0.01)

    def _query(self, client: httpx.Client, i: int) -> None:
        text = document(i)
        self.queries += 1
        for _attempt in range(TRIES):
            try:
                answer = client.post(
                    "/v1/embeddings",
                    json={"model": "kb.query@1", "input": text},
                    headers={"Authorization": f"Bearer {self.secret}"},
                )
            except httpx.HTTPError as exc:
                self.failed.append(f"query {i}: {type(exc).__name__}")
                return
            if answer.status_code != 200:
                self.failed.append(f"query {i}: HTTP {answer.status_code} {answer.text[:200]}")
                return
            space = answer.headers.get("x-modelforge-embedding-space", "")
            embedding = answer.json()["data"][0]["embedding"]
            hits = self.adapter.search("kb", embedding, space=space, k=3)
            if not hits:
                # The alias moved between the embedding and the search: embed again, in the new space
                # (the gateway learns the switch within about a second: its routing table's refresh).
                self.retried += 1
                time.sleep(RETRY_PAUSE_S)
                continue
            self.spaces_seen[space] = self.spaces_seen.get(space, 0) + 1
            if any(h.space != space for h in hits) or hits[0].id != f"d{i:06d}":
                self.wrong_space.append(f"query {i} in {space}: {[(h.id, h.space) for h in hits]}")
            return
        self.failed.append(f"query {i}: no answer after {TRIES} tries")
