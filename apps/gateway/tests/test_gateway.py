"""The serving gateway over real HTTP (gunicorn), to real backend processes: the OpenAI SDK unmodified,
shares that follow the weights, streaming chunk by chunk, and the scope table of refusals."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from openai import OpenAI

from apps.clusters import services
from apps.clusters.models import ClientCredential
from apps.clusters.tests.factories import (
    bind,
    cluster_with,
    credential,
    echo_backend,
    loopback_node,
    running_server,
)
from tests.fixtures import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def backends(tmp_path):
    started = [echo_backend(tmp_path, name) for name in ("echo-a", "echo-b")]
    yield [port for _, port in started]
    for process, _ in started:
        if process.process.poll() is None:
            os.killpg(process.process.pid, signal.SIGTERM)
            process.process.wait(10)


@pytest.fixture
def routed(backends):
    """rag.embedding@1 and chat.general@1 served by one cluster of two backends, weights 3:1."""
    node = loopback_node()
    a = running_server(node, "echo-a", backends[0])
    b = running_server(node, "echo-b", backends[1])
    cluster = cluster_with("pair", [(a, 3), (b, 1)])
    bind("rag.embedding@1", cluster=cluster)
    bind("chat.general@1", cluster=cluster)
    return cluster


def sdk(live_web, key: str) -> OpenAI:
    return OpenAI(base_url=live_web.url + "/v1", api_key=key, max_retries=0, timeout=20)


def wait_for_route(live_web, key: str, capability: str = "rag.embedding@1") -> None:
    """Each web process re-reads its routing table within about a second of a change."""

    def routed_ok() -> bool:
        response = httpx.post(
            live_web.url + "/v1/embeddings",
            json={"model": capability, "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        return response.status_code == 200

    assert wait_until(routed_ok, 15)


def test_the_openai_sdk_gets_embeddings_with_shares_that_follow_the_weights(live_web, routed):
    key = credential(["rag.embedding@1", "chat.general@1"])
    wait_for_route(live_web, key)
    client = sdk(live_web, key)
    served: Counter[str] = Counter()
    for i in range(40):
        raw = client.embeddings.with_raw_response.create(model="rag.embedding@1", input=[f"text {i}"])
        served[raw.headers["x-modelforge-backend"]] += 1
        assert len(raw.parse().data[0].embedding) == 8
    # Smooth weighted round-robin: exactly 3:1 over any window of 4.
    assert served == {"pair/echo-a": 30, "pair/echo-b": 10}
    assert [m.id for m in client.models.list()] == ["chat.general@1", "rag.embedding@1"]


def test_prefix_affinity_over_the_sdk_by_conversation_start_or_session_header(live_web, routed):
    """The cluster switched to prefix_affinity at runtime: each tenant's long system prompt, and each
    X-ModelForge-Session, keeps to one backend whatever the user turn (the many-process and outage cases
    are in test_affinity_http.py)."""
    routed.algorithm = "prefix_affinity"
    routed.save()
    key = credential(["chat.general@1"])
    wait_for_route(live_web, key, "chat.general@1")
    client = sdk(live_web, key)

    def affinity_in_force() -> bool:
        # The route may answer from a table built before the switch (weighted round-robin, 3:1: any four
        # requests in a row reach both backends); four in a row on one backend is the new table.
        served = {
            client.chat.completions.with_raw_response.create(
                model="chat.general@1",
                messages=[{"role": "system", "content": "probe " * 200}, {"role": "user", "content": "q"}],
            ).headers["x-modelforge-backend"]
            for _ in range(4)
        }
        return len(served) == 1

    assert wait_until(affinity_in_force, 15)
    served: dict[str, set[str]] = {}
    for turn in range(4):
        for tenant in range(6):
            system = f"You answer for tenant {tenant}. " + f"Rule {tenant}: cite the contract. " * 40
            raw = client.chat.completions.with_raw_response.create(
                model="chat.general@1",
                messages=[{"role": "system", "content": system}, {"role": "user", "content": f"q{turn}"}],
            )
            served.setdefault(f"tenant {tenant}", set()).add(raw.headers["x-modelforge-backend"])
            raw = client.chat.completions.with_raw_response.create(
                model="chat.general@1",
                messages=[{"role": "user", "content": f"turn {turn} of a short chat"}],
                extra_headers={"X-ModelForge-Session": f"conversation-{tenant}"},
            )
            served.setdefault(f"session {tenant}", set()).add(raw.headers["x-modelforge-backend"])
    assert all(len(backends) == 1 for backends in served.values()), served
    # Both backends are used. Where a prefix lands depends on the ring, and the ring on the servers' random
    # ids: with weights 3:1, twelve prefixes all land on the weight-3 backend in about one run in thirty
    # (0.75 ** 12; CI, 2026-12-03 and 2026-12-04). Forty more sessions make that about one in three
    # million (0.75 ** 52).
    for extra in range(40):
        raw = client.chat.completions.with_raw_response.create(
            model="chat.general@1",
            messages=[{"role": "user", "content": "one turn"}],
            extra_headers={"X-ModelForge-Session": f"another-{extra}"},
        )
        served.setdefault(f"another {extra}", set()).add(raw.headers["x-modelforge-backend"])
    assert len(set().union(*served.values())) == 2, served


def test_streaming_chat_passes_through_chunk_by_chunk(live_web, routed):
    key = credential(["chat.general@1"])
    wait_for_route(live_web, key, "chat.general@1")
    client = sdk(live_web, key)
    started = time.monotonic()
    arrivals, words = [], []
    stream = client.chat.completions.create(
        model="chat.general@1", stream=True, messages=[{"role": "user", "content": "one two three four"}]
    )
    for chunk in stream:
        arrivals.append(time.monotonic() - started)
        if chunk.choices and chunk.choices[0].delta.content:
            words.append(chunk.choices[0].delta.content)
    assert "".join(words) == "echo: one two three four"
    # The backend pauses 0.2 s between chunks: unbuffered, the first arrives long before the last.
    assert arrivals[0] < 0.5 and arrivals[-1] - arrivals[0] > 0.6


def test_no_running_backend_is_503_no_eligible_node(live_web, backends):
    node = loopback_node()
    server = running_server(node, "echo-a", backends[0])
    bind("rag.embedding@1", server=server)
    key = credential(["rag.embedding@1"])
    wait_for_route(live_web, key)
    server.state = "stopped"
    server.save(update_fields=["state"])

    def refused() -> bool:
        response = httpx.post(
            live_web.url + "/v1/embeddings",
            json={"model": "rag.embedding@1", "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        return response.status_code == 503 and response.json()["code"] == "NO_ELIGIBLE_NODE"

    assert wait_until(refused, 15)


def test_the_scope_table(live_web, routed):
    good = credential(["rag.embedding@1"])
    wait_for_route(live_web, good)
    other_project = credential(["rag.embedding@1"], project="team-b")
    bind("rag.embedding@1", cluster=routed, project="team-a", tier=1)
    # Seeds (401 CAPABILITY_NOT_AUTHORIZED): a project-bound client cannot serve another project's binding.
    bind("rag.private@1", cluster=routed, project="team-a")
    team_a = credential(["rag.private@1"], project="team-a")
    team_b = credential(["rag.private@1"], project="team-b")
    unbound = credential(["rag.private@1"])
    revoked_key = credential(["rag.embedding@1"])
    ClientCredential.objects.get(display_prefix=revoked_key[:12]).revoke()
    expired_key = credential(["rag.embedding@1"], expires_at=timezone.now() - timedelta(seconds=1))
    cases = {
        "missing": (None, "rag.embedding@1"),
        "malformed": ("not-a-credential", "rag.embedding@1"),
        "unknown": ("mfc_" + "x" * 43, "rag.embedding@1"),
        "revoked": (revoked_key, "rag.embedding@1"),
        "expired": (expired_key, "rag.embedding@1"),
        "version 2": (good, "rag.embedding@2"),
        "whitespace": (good, "rag.embedding@1 "),
        "case": (good, "RAG.embedding@1"),
        "another project's binding": (team_b, "rag.private@1"),
        "a project's binding, no project": (unbound, "rag.private@1"),
    }

    def call(key: str | None, model: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(
            live_web.url + "/v1/embeddings", json={"model": model, "input": "x"}, headers=headers, timeout=10
        )

    # Every process sees the new credentials within about a second.
    assert wait_until(
        lambda: call(revoked_key, "rag.embedding@1").json()["message"] == "The credential was revoked.", 15
    )
    refusals = {name: call(key, model) for name, (key, model) in cases.items()}
    messages = set()
    for name, response in refusals.items():
        assert response.status_code == 401, name
        body = response.json()
        assert set(body) == {"code", "message", "correlation_id"}, name
        assert body["code"] == "CAPABILITY_NOT_AUTHORIZED", name
        assert response.headers["www-authenticate"] == 'Bearer realm="modelforge-gateway"', name
        assert body["correlation_id"] == response.headers["x-correlation-id"]
        messages.add(body["message"])
        # Byte-identical apart from message and correlation id.
        stripped = json.dumps({**body, "message": "", "correlation_id": ""}, sort_keys=True)
        assert stripped == '{"code": "CAPABILITY_NOT_AUTHORIZED", "correlation_id": "", "message": ""}'
    assert len(messages) >= 7  # the human message says which, to a caller who holds the secret
    assert "not bound for project 'team-b'" in refusals["another project's binding"].json()["message"]
    assert call(team_a, "rag.private@1").status_code == 200
    assert call(good, "rag.embedding@1").status_code == 200
    # A project-bound credential reaches only unbound tiers and its own project's.
    assert call(other_project, "rag.embedding@1").status_code == 200


def test_backend_errors_reach_the_client_as_the_envelope(live_web, routed):
    key = credential(["rag.embedding@1"])
    wait_for_route(live_web, key)

    def call(text: str) -> httpx.Response:
        return httpx.post(
            live_web.url + "/v1/embeddings",
            json={"model": "rag.embedding@1", "input": text},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )

    failed = call("__status_500__")
    assert failed.status_code == 502
    assert set(failed.json()) == {"code", "message", "correlation_id"}
    assert failed.json()["code"] == "UPSTREAM_FAILED" and "asked to fail with 500" in failed.json()["message"]
    rejected = call("__status_422__")
    assert rejected.status_code == 422
    assert (
        rejected.json()["code"] == "UPSTREAM_REJECTED"
        and "asked to fail with 422" in rejected.json()["message"]
    )


def test_a_tier_whose_cluster_has_no_server_attached_is_refused_naming_the_cluster(live_web, routed):
    # Issue 48: detached for a membership change, the cluster was refused as NO_ELIGIBLE_NODE, "no online,
    # enabled node runs one", which sends the operator to the nodes.
    key = credential(["rag.embedding@1"])
    wait_for_route(live_web, key)
    for member in routed.members.all():
        services.detach(member)

    def embed() -> httpx.Response:
        return httpx.post(
            live_web.url + "/v1/embeddings",
            json={"model": "rag.embedding@1", "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )

    assert wait_until(lambda: embed().status_code == 503, 15)
    response = embed()
    assert (response.status_code, response.headers["retry-after"]) == (503, "5")
    body = response.json()
    assert body["code"] == "CLUSTER_DETACHED", body
    assert "cluster 'pair' (tier 0) has no server attached" in body["message"]
