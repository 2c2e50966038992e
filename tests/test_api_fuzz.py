"""schemathesis over every operation of the OpenAPI document, in process: a short run with a fixed seed.

Each operation is a test of its own, called through Django's WSGI handler with the operator's key, with
positive and negative cases (about four each). Every answer must be documented by the schema (status
code, content type, body and headers), a schema-valid request must not be refused with a 400 (the
schema states every rule the server enforces) but for a refusal its operation documents for what is
stored (``x-modelforge-state-refusals``), and the error contract holds (tests/contract_checks.py):
the envelope on every error, the exact plain 500, no 500 at all.

Positive cases are steered to a small world of real rows (``world``, ``steer_to_world``), so that they
reach the code behind the 404; each example runs in a savepoint rolled back after it. The coverage and
stateful phases, and many more examples, are the long run's: bench/fuzz/run.py against a server.
``MODELFORGE_TEST_FUZZ_EXAMPLES`` and ``MODELFORGE_TEST_FUZZ_SEED`` make a local run look harder or
elsewhere. Then: every credential class against every operation, and the findings of the runs, each
held by a test of its own.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connections, transaction
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.contract_checks import (
    CONTRACT_CHECKS,
    STATE_REFUSALS,
    documented_state_refusal,
    positive_data_acceptance_documented,
)

SEED = int(os.environ.get("MODELFORGE_TEST_FUZZ_SEED", "20261130"))
# About 370 cases in 20-30 s on the 2-core machine: make test's budget.
MAX_EXAMPLES = int(os.environ.get("MODELFORGE_TEST_FUZZ_EXAMPLES", "4"))

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        # U+0000 is refused anywhere in a body, keys included (modelforge.parsers): a rule the schema
        # states for text fields (their pattern) but cannot for the keys of an open object.
        "generation": {"max-examples": MAX_EXAMPLES, "mode": "all", "database": "none", "allow-x00": False},
        # Coverage (hundreds of boundary cases per operation) and stateful sequences: the long run's.
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    }
)


def _document() -> dict[str, Any]:
    # The document /api/v1/schema/ serves (the view runs the same generator); built here so that
    # collecting this module needs no database or HTTP round trip.
    return SchemaGenerator().get_schema(request=None, public=True)


DOCUMENT = _document()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)
schema.app = WSGIHandler()

# Operations whose acceptance of a schema-valid body depends on stored rows or configuration the schema
# cannot see, beyond the refusals they document (x-modelforge-state-refusals): the acceptance check is
# left out for them; every other check runs.
ACCEPTANCE_DEPENDS_ON_STATE = {
    "POST /api/v1/servers": "placement: the runtime profile's own rules (GPUs, weights), nodes, capacity",
    "POST /api/v1/clusters": "its servers must exist, be live and serve no member yet",
    # Embedding migrations act on a vector store and on recorded spaces: the store must answer, the
    # capabilities be named (by name, which no steering can pick from a drawn string) and have spaces.
    "POST /api/v1/vector-stores": "the store at the DSN must answer and hold vectors",
    "POST /api/v1/vector-stores/{id}/indexes": "a capability by name, with a recorded space",
    "POST /api/v1/consumer-aliases": "a capability by name, with a recorded space; the index in the store",
    "POST /api/v1/cutovers": "a target capability by name, with a recorded space",
    "POST /api/v1/embedding-spaces/measure": "a capability by name, served by a running backend",
    "PUT /api/v1/routing-tiers/{id}": "exactly one of cluster and server: a field left out keeps its value",
    "PATCH /api/v1/routing-tiers/{id}": "exactly one of cluster and server, counting the stored binding",
}

CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    # schemathesis's positive_data_acceptance, which also passes the refusals an operation documents for
    # what is stored (a taken name, a row that does not exist), and nothing else.
    positive_data_acceptance_documented,
    *CONTRACT_CHECKS,
]
CHECKS_WITHOUT_ACCEPTANCE = [check for check in CHECKS if check is not positive_data_acceptance_documented]


@pytest.fixture(autouse=True)
def _keep_the_test_connection() -> Iterator[None]:
    """Django closes the connection at the end of each request; the test's transaction lives on it.
    Django's own test client disconnects the same receivers."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture(scope="module", autouse=True)
def _close_the_monitoring_connection() -> Iterator[None]:
    """The observability alias shares the test database without being its alias: Django's teardown
    closes only the default connection before it drops the database, so a connection left open here
    would keep it from being dropped."""
    yield
    connections["observability"].close()


@pytest.fixture
def world(settings: Any, tmp_path: Path) -> dict[str, Any]:
    """One or two rows of every kind an operation's path can name, in the states whose answers differ,
    so that positive cases reach real rows rather than 404s. Keys are the paths' first segment; lists of
    ids, except ``local-source``, a folder under the allowed local roots."""
    from apps.alerts.models import Alert, Notification, NotificationChannel
    from apps.artifacts.models import Artifact, Replica
    from apps.backups.models import Backup, Restore
    from apps.clusters.models import Capability, ClientCredential, Cluster, ClusterMember, RoutingTier
    from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace, VectorStore
    from apps.nodes.models import EnrollmentToken
    from apps.nodes.tests.factories import beat, heartbeat_report, make_node
    from apps.observability.models import TelemetrySample, TrafficSample
    from apps.servers.models import ModelServer

    now = timezone.now()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"fuzz")
    settings.ARTIFACT_LOCAL_ROOTS = [tmp_path]
    # An agent on a closed loopback port: a call to it is refused at once, never waited on.
    node, credential = make_node(name="fuzz-node", agent_url="http://127.0.0.1:1")
    beat(credential, {**heartbeat_report(gpus=1), "agent_url": "http://127.0.0.1:1"})
    quiet, _ = make_node(name="fuzz-quiet", accelerator="cpu", enabled=False, agent_url="http://127.0.0.1:1")
    TelemetrySample.objects.create(
        node_id=node.pk,
        node_name=node.name,
        gpu_index=0,
        at=now,
        reported_at=now,
        memory_total_bytes=2**34,
        memory_used_bytes=2**32,
        memory_managed_bytes=2**31,
        utilization_percent=40,
        temperature_c=60,
    )
    running = ModelServer.objects.create(
        name="fuzz-running", profile="test-echo", model="m", node=node, port=9, state="running"
    )
    failed = ModelServer.objects.create(
        name="fuzz-failed",
        profile="test-echo",
        model="m",
        node=node,
        state="failed",
        failure_code="PROCESS_LOST",
    )
    starting = ModelServer.objects.create(
        name="fuzz-starting", profile="test-echo", model="m", node=node, state="starting"
    )
    TrafficSample.objects.create(backend=str(running.pk), minute=now, requests=3, errors=1)
    used, _ = EnrollmentToken.objects.mint(note="used")
    EnrollmentToken.objects.filter(pk=used.pk).update(node=node, used_at=now)
    fresh, _ = EnrollmentToken.objects.mint(note="fresh")
    Alert.objects.raise_alert("WORK_STUCK", "warning", "node", str(node.pk), node.name, "fuzz")
    alert = Alert.objects.get()
    channel = NotificationChannel.objects.create(
        name="fuzz-hook", kind="webhook", target="http://127.0.0.1:1/"
    )
    notification = Notification.objects.create(channel=channel, alert=alert, event="raised")
    digest = "0" * 64
    ready = Artifact.objects.create(
        name="fuzz-ready",
        source_kind="huggingface",
        locator="org/model",
        revision="r1",
        state="ready",
        expected_sha256={"model.bin": digest},
        files=[{"path": "model.bin", "size": 1, "sha256": digest}],
    )
    broken = Artifact.objects.create(
        name="fuzz-failed",
        source_kind="huggingface",
        locator="org/other",
        revision="r1",
        state="failed",
        failure_code="SOURCE_UNREACHABLE",
    )
    waiting = Artifact.objects.create(
        name="fuzz-requested", source_kind="huggingface", locator="org/w", revision="r1"
    )
    quarantined = Artifact.objects.create(
        name="fuzz-quarantined",
        source_kind="huggingface",
        locator="org/q",
        revision="r1",
        state="quarantined",
        quarantine_rule="licence",
    )
    present = Replica.objects.create(artifact=ready, node=node, name="fuzz-ready", state="present")
    copying = Replica.objects.create(artifact=ready, node=quiet, name="fuzz-ready", state="requested")
    verified = Backup.objects.create(
        state="verified", finished_at=now, consistent_as_of=now - timedelta(minutes=1), verified_at=now
    )
    queued = Backup.objects.create(state="queued")
    reviewable = Restore.objects.create(
        backup=verified,
        state="failed",
        requested_by="fuzz",
        reason="fuzz",
        needs_review=True,
        failure_code="RESTORE_FAILED",
    )
    pending = Restore.objects.create(backup=verified, state="queued", requested_by="fuzz", reason="fuzz")
    capability = Capability.objects.create(name="fuzz.chat@1")
    cluster = Cluster.objects.create(name="fuzz-cluster")
    member = ClusterMember.objects.create(cluster=cluster, name="fuzz-m1", server=running)
    spare = ClusterMember.objects.create(cluster=Cluster.objects.create(name="fuzz-empty"), name="fuzz-m2")
    tier = RoutingTier.objects.create(capability=capability, cluster=cluster)
    client, _ = ClientCredential.objects.mint(name="fuzz", scopes=[capability.name])
    # Embedding migrations' rows (no vector store answers at this address: acting on it is refused).
    space = EmbeddingSpace.objects.create(
        capability=capability, model="fuzz-model", dimension=8, normalized=True, recorded_by="fuzz"
    )
    store = VectorStore.objects.create(
        name="fuzz-store", kind="pgvector", dsn="postgresql://postgres@127.0.0.1:1/x"
    )
    query = Capability.objects.create(name="fuzz.query@1", follows=capability)
    alias = ConsumerAlias.objects.create(
        store=store, name="fuzz_kb", index="fuzz_v1", capability=capability, query_capability=query
    )
    cutover = Cutover.objects.create(
        alias=alias,
        source_capability=capability,
        target_capability=capability,
        source_index="fuzz_v1",
        target_index="fuzz_v1",
        source_space={**space.identity(), "key": space.key},
        target_space={**space.identity(), "key": space.key},
        same_space=True,
        created_by="fuzz",
    )

    def ids(*rows: Any) -> list[str]:
        return [str(row.pk) for row in rows]

    return {
        "alerts": ids(alert),
        "artifacts": ids(ready, broken, waiting, quarantined),
        "backups": ids(verified, queued),
        "capabilities": ids(capability),
        "embedding-spaces": ids(space),
        "vector-stores": ids(store),
        "consumer-aliases": ids(alias),
        "cutovers": ids(cutover),
        "client-credentials": ids(client),
        "cluster-members": ids(member, spare),
        "clusters": ids(cluster, spare.cluster),
        "enrollment-tokens": ids(used, fresh),
        "nodes": ids(node, quiet),
        "node-names": [node.name, quiet.name],
        "notification-channels": ids(channel),
        "notifications": ids(notification),
        "replicas": ids(present, copying),
        "restores": ids(reviewable, pending),
        "routing-tiers": ids(tier),
        "servers": ids(running, failed, starting),
        "unattached-servers": ids(failed, starting),
        "local-source": str(tmp_path / "model"),
        # system/work/{kind}/{id}: the rows waiting on work, by kind
        "work:artifact": ids(waiting),
        "work:backup": ids(queued),
        "work:replica": ids(copying),
        "work:restore": ids(pending),
        "work:server": ids(starting),
    }


# Fields and query parameters that name another row, and the world's rows of that kind.
REFERENCES = {
    "alias": "consumer-aliases",
    "store": "vector-stores",
    "alert": "alerts",
    "artifact": "artifacts",
    "backup": "backups",
    "capability": "capabilities",
    "channel": "notification-channels",
    "cluster": "clusters",
    "node": "nodes",
    "server": "servers",
}


def _pick(rows: list[str], drawn: Any) -> Any:
    """One of ``rows``, chosen by the drawn value (so the seed still decides), typed as it was drawn."""
    row = rows[zlib.crc32(str(drawn).encode()) % len(rows)]
    return int(row) if isinstance(drawn, int) and not isinstance(drawn, bool) else row


def steer_to_world(case: schemathesis.Case, world: dict[str, Any]) -> None:
    """A positive case names the world's rows (in its path, its references in the body and in the
    query) instead of ids that almost surely do not exist: a 404 or "object does not exist" says nothing
    about the schema. So do the few rules on state that no schema can state: a server attached once, a
    local source under the allowed roots, a credential's expiry in the future. Negative parts stay as
    drawn."""
    if case.meta is None:
        return
    if case.path_parameters and not case.meta.is_negative_at(ParameterLocation.PATH):
        segment = case.operation.path.split("/")[3]
        if segment == "system":
            segment = f"work:{case.path_parameters.get('kind')}"
        if world.get(segment):
            case.path_parameters["id"] = _pick(world[segment], case.path_parameters.get("id"))
    if case.query and not case.meta.is_negative_at(ParameterLocation.QUERY):
        for name, kind in REFERENCES.items():
            if name in case.query and case.query[name] not in (None, ""):
                case.query[name] = _pick(world[kind], case.query[name])
    if isinstance(case.body, dict) and not case.meta.is_negative_at(ParameterLocation.BODY):
        for name, kind in REFERENCES.items():
            if case.body.get(name) is None:
                continue
            rows = world[kind]
            if (name, case.operation.path) == ("node", "/api/v1/servers"):
                rows = world["node-names"]  # POST /servers pins to a node by its name, not its id
            elif name == "server" and case.operation.path.endswith("/attach"):
                rows = world["unattached-servers"]
            case.body[name] = _pick(rows, case.body[name])
        if case.body.get("source_kind") == "local":
            case.body["locator"] = world["local-source"]
        if case.body.get("expires_at") is not None:
            case.body["expires_at"] = (timezone.now() + timedelta(days=1)).isoformat()


@pytest.mark.django_db(databases="__all__")
@schema.parametrize()
# The world is built once per operation and shared by its examples, on purpose: they read and act on it.
@hypothesis.settings(suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
def test_every_operation_answers_as_documented(case: schemathesis.Case, world: dict[str, Any]) -> None:
    steer_to_world(case, world)
    # Each example starts from the same world: what one created is rolled back before the next, so a
    # name drawn twice is not refused as taken.
    with transaction.atomic(), transaction.atomic(using="observability"):
        try:
            case.call_and_validate(
                headers={"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"},
                checks=CHECKS_WITHOUT_ACCEPTANCE
                if case.operation.label in ACCEPTANCE_DEPENDS_ON_STATE
                else CHECKS,
            )
        finally:
            transaction.set_rollback(True)
            transaction.set_rollback(True, using="observability")


# Every credential that is not the operator's, against every operation: each class is refused the same
# way on every route (one status, code and message), as the envelope.
CREDENTIAL_CLASSES = [
    "none",
    "wrong operator key",
    "node credential",
    "client credential",
    "enrollment token",
    "basic auth",
    "non-staff session",
]


@pytest.mark.django_db
def test_no_credential_but_the_operators_opens_any_operation(settings: Any) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from apps.clusters.models import ClientCredential
    from apps.nodes.models import EnrollmentToken
    from apps.nodes.tests.factories import make_node

    # Wrong credentials are the point here: the per-address block (429) would hide the refusals.
    settings.API_AUTH_FAILURE_LIMIT = 10_000
    _, node_credential = make_node(name="cred-node")
    _, client_credential = ClientCredential.objects.mint(name="cred", scopes=["x.y@1"])
    _, token = EnrollmentToken.objects.mint()
    headers = {
        "none": {},
        "wrong operator key": {"HTTP_AUTHORIZATION": "Bearer " + "x" * 43},
        "node credential": {"HTTP_AUTHORIZATION": f"Bearer {node_credential}"},
        "client credential": {"HTTP_AUTHORIZATION": f"Bearer {client_credential}"},
        "enrollment token": {"HTTP_AUTHORIZATION": f"Bearer {token}"},
        "basic auth": {"HTTP_AUTHORIZATION": "Basic b3BlcmF0b3I6b3BlcmF0b3I="},
        "non-staff session": {},
    }
    session = Client()
    session.force_login(User.objects.create_user("not-staff", password="a-long-password-1"))
    answers: dict[str, set[tuple[int, str, str]]] = {name: set() for name in CREDENTIAL_CLASSES}
    routes = 0
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            if path == "/api/v1/agent/enroll":
                continue  # no credential by design: the enrollment token is in the body
            url = path.replace("{kind}", "backup")
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] == "id":
                    uuid = parameter["schema"].get("format") == "uuid"
                    url = url.replace("{id}", "6f1c9c3e-0000-4000-8000-000000000001" if uuid else "1")
            routes += 1
            for name in CREDENTIAL_CLASSES:
                client = session if name == "non-staff session" else Client()
                response = client.generic(
                    method.upper(), url, "{}", content_type="application/json", **headers[name]
                )
                body = response.json()
                assert set(body) == {"code", "message", "correlation_id"}, (name, method, path, body)
                answers[name].add((response.status_code, body["code"], body["message"]))
    assert routes > 80
    for name, seen in answers.items():
        assert len(seen) == 1, (name, seen)
        status, code, _ = next(iter(seen))
        assert (status, code) == (
            (403, "PERMISSION_DENIED") if name == "non-staff session" else (401, "NOT_AUTHENTICATED")
        ), (name, seen)


# --- What the runs found, each held by a test of its own ----------------------------------------------


def assert_refused(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "correlation_id"} and body["code"] == code, body
    return str(body["message"])


@pytest.mark.django_db
def test_a_taken_capability_name_is_a_documented_409_not_a_500(operator_client: Any) -> None:
    # bench/fuzz: the declared name field had dropped the model's unique check (IntegrityError, a 500);
    # then a 400 VALIDATION_ERROR that the schema did not document (issue 47): now 409 NAME_TAKEN.
    first = operator_client.post("/api/v1/capabilities", {"name": "rag.embedding@1"}, format="json")
    other = operator_client.post("/api/v1/capabilities", {"name": "chat.general@1"}, format="json")
    assert first.status_code == other.status_code == 201
    again = operator_client.post("/api/v1/capabilities", {"name": "rag.embedding@1"}, format="json")
    assert "exists" in assert_refused(again, 409, "NAME_TAKEN")
    url = f"/api/v1/capabilities/{other.json()['id']}"
    assert_refused(operator_client.put(url, {"name": "rag.embedding@1"}, format="json"), 409, "NAME_TAKEN")
    assert_refused(operator_client.patch(url, {"name": "rag.embedding@1"}, format="json"), 409, "NAME_TAKEN")
    assert operator_client.patch(url, {"name": "chat.general@1"}, format="json").status_code == 200
    for method in ("post", "put", "patch"):
        path = "/api/v1/capabilities" if method == "post" else "/api/v1/capabilities/{id}"
        assert state_refusals(method, path) == {"NAME_TAKEN": 409}


@pytest.mark.django_db
def test_a_webhook_httpx_cannot_send_to_is_refused_and_a_stored_one_fails_delivery_not_a_500(
    operator_client: Any,
) -> None:
    # bench/fuzz: a host that is not a valid IDNA name (or a port that is not a number) made the channel's
    # test raise httpx.InvalidURL, a 500.
    from apps.alerts.models import NotificationChannel

    for target in ("http://\U0007ed85\u00ea/", "https://example.test:port/"):
        refused = operator_client.post(
            "/api/v1/notification-channels",
            {"name": "hook", "kind": "webhook", "target": target},
            format="json",
        )
        assert "webhook" in assert_refused(refused, 400, "VALIDATION_ERROR")
    stored = NotificationChannel.objects.create(name="old", kind="webhook", target="http://\U0007ed85\u00ea/")
    answer = operator_client.post(f"/api/v1/notification-channels/{stored.pk}/test")
    assert "InvalidURL" in assert_refused(answer, 502, "NOTIFICATION_FAILED")


@pytest.mark.django_db
def test_an_agent_url_the_control_plane_cannot_call_is_refused_at_enrollment(client: Any) -> None:
    # The same class as the webhook: the first signed call to such an agent raised httpx.InvalidURL.
    from apps.nodes.models import EnrollmentToken

    _, token = EnrollmentToken.objects.mint()
    body = {"token": token, "name": "n1", "accelerator": "cpu", "agent_version": "0.1.0"}
    for url in ("http://\U0007ed85\u00ea:8471", "http://host:port"):
        answer = client.post(
            "/api/v1/agent/enroll", {**body, "agent_url": url}, content_type="application/json"
        )
        assert "agent_url" in assert_refused(answer, 400, "VALIDATION_ERROR")
    enrolled = client.post(
        "/api/v1/agent/enroll", {**body, "agent_url": "http://gpu-01:8471"}, content_type="application/json"
    )
    assert enrolled.status_code == 201, enrolled.content


@pytest.mark.django_db
def test_asking_again_for_a_replica_retries_it_rather_than_refusing_a_duplicate(operator_client: Any) -> None:
    # The fuzz run: a second POST /replicas for the same artifact and node was 400 "must make a unique
    # set", though asking again is how a failed replica is retried (replication.request_replica).
    from apps.artifacts.models import Artifact, Replica
    from apps.nodes.tests.factories import make_node

    node, _ = make_node(name="again")
    artifact = Artifact.objects.create(name="a", source_kind="huggingface", locator="org/a", state="ready")
    replica = Replica.objects.create(
        artifact=artifact, node=node, name="a", state="failed", reason="copy broke"
    )
    answer = operator_client.post(
        "/api/v1/replicas", {"artifact": artifact.pk, "node": str(node.pk)}, format="json"
    )
    assert answer.status_code == 202, answer.content
    assert answer.json()["id"] == replica.pk and answer.json()["state"] == "requested"


# --- Refusals for what is stored: named, and documented by the operations that answer them (issue 47) ---


def state_refusals(method: str, path: str) -> dict[str, int]:
    return dict(DOCUMENT["paths"][path][method].get(STATE_REFUSALS, {}))


@pytest.mark.django_db
def test_a_row_that_does_not_exist_is_a_documented_reference_not_found(operator_client: Any) -> None:
    # bench/fuzz: "Invalid pk - object does not exist" and a filter's "Select a valid choice" were 400
    # VALIDATION_ERROR, the answer to a malformed body, for requests the schema calls valid.
    from apps.nodes.tests.factories import make_node

    node, _ = make_node(name="ref-node")
    missing = operator_client.post(
        "/api/v1/replicas", {"artifact": 999999, "node": str(node.pk)}, format="json"
    )
    assert "artifact" in assert_refused(missing, 400, "REFERENCE_NOT_FOUND")
    listed = operator_client.get("/api/v1/replicas", {"artifact": 999999})
    assert "artifact" in assert_refused(listed, 400, "REFERENCE_NOT_FOUND")
    by_name = operator_client.post(
        "/api/v1/embedding-spaces/measure", {"capability": "no.such@1"}, format="json"
    )
    assert "capability" in assert_refused(by_name, 400, "REFERENCE_NOT_FOUND")
    # A value that cannot be a key, or a missing row next to a malformed field, is still a malformed request.
    assert_refused(operator_client.get("/api/v1/replicas", {"node": "not-a-uuid"}), 400, "VALIDATION_ERROR")
    mixed = operator_client.post(
        "/api/v1/replicas", {"artifact": 999999, "node": "not-a-uuid"}, format="json"
    )
    assert_refused(mixed, 400, "VALIDATION_ERROR")
    assert operator_client.get("/api/v1/replicas", {"node": str(node.pk)}).status_code == 200
    for method, path in [
        ("post", "/api/v1/replicas"),
        ("get", "/api/v1/replicas"),
        ("post", "/api/v1/embedding-spaces/measure"),
        ("get", "/api/v1/notifications"),
        ("post", "/api/v1/routing-tiers"),
    ]:
        assert state_refusals(method, path) == {"REFERENCE_NOT_FOUND": 400}, (method, path)
    # POST /servers pins a node by its name, which the scheduler looks up (not a related field).
    pinned = {"name": "s1", "profile": "test-echo", "model": "m", "node": "no-such-node"}
    assert "no-such-node" in assert_refused(
        operator_client.post("/api/v1/servers", pinned, format="json"), 400, "REFERENCE_NOT_FOUND"
    )
    assert state_refusals("post", "/api/v1/servers")["REFERENCE_NOT_FOUND"] == 400
    # An operation that names no other row documents none.
    assert state_refusals("get", "/api/v1/nodes") == {}


@pytest.mark.django_db
def test_a_past_expiry_is_a_documented_refusal_for_the_clock(operator_client: Any) -> None:
    # bench/fuzz: a credential's past expires_at was a VALIDATION_ERROR the schema could not state.
    past = (timezone.now() - timedelta(days=1)).isoformat()
    body = {"name": "app", "scopes": ["rag.embedding@1"], "expires_at": past}
    answer = operator_client.post("/api/v1/client-credentials", body, format="json")
    assert "expires_at" in assert_refused(answer, 400, "EXPIRY_IN_PAST")
    assert state_refusals("post", "/api/v1/client-credentials") == {"EXPIRY_IN_PAST": 400}
    documented = DOCUMENT["paths"]["/api/v1/client-credentials"]["post"]["responses"]["400"]["description"]
    assert "EXPIRY_IN_PAST" in documented


@pytest.mark.django_db
def test_the_acceptance_check_passes_a_documented_refusal_and_nothing_else(operator_client: Any) -> None:
    # What bench/fuzz gates on: a schema-valid request refused with a code its operation documents, with
    # that status, passes; an undocumented code, or a documented one with another status, does not.
    from apps.clusters.models import Capability

    Capability.objects.create(name="rag.embedding@1")
    operation = schema["/api/v1/capabilities"]["POST"]
    case = operation.Case(body={"name": "rag.embedding@1"}, media_type="application/json")
    taken = case.call(headers={"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"})
    assert taken.status_code == 409
    assert documented_state_refusal(case, taken) == "NAME_TAKEN"
    other = schema["/api/v1/enrollment-tokens"]["POST"].Case(body={}, media_type="application/json")
    assert documented_state_refusal(other, taken) is None  # NAME_TAKEN is not that operation's
    malformed = operation.Case(body={"name": "Not A Capability"}, media_type="application/json")
    refused = malformed.call(headers={"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"})
    assert refused.status_code == 400 and documented_state_refusal(malformed, refused) is None
    # The documented code with another status than the one documented is not the documented refusal.
    taken.status_code = 400
    assert documented_state_refusal(case, taken) is None


@pytest.mark.django_db
def test_a_channel_patch_judged_with_its_stored_kind_is_a_documented_conflict(operator_client: Any) -> None:
    # bench/fuzz: PATCH {"kind": "email"} of a webhook channel was a VALIDATION_ERROR of the stored target,
    # for a body the schema calls valid (it cannot see the stored target).
    from apps.alerts.models import NotificationChannel

    hook = NotificationChannel.objects.create(name="hook", kind="webhook", target="https://hooks.example/x")
    url = f"/api/v1/notification-channels/{hook.pk}"
    alone = operator_client.patch(url, {"kind": "email"}, format="json")
    assert "e-mail" in assert_refused(alone, 409, "CONFLICTS_WITH_STORED")
    target = operator_client.patch(url, {"target": "ops@example.org"}, format="json")
    assert_refused(target, 409, "CONFLICTS_WITH_STORED")
    # Sent together, the two are the body's own shape: a malformed request, as before.
    both = operator_client.patch(url, {"kind": "email", "target": "not an address"}, format="json")
    assert_refused(both, 400, "VALIDATION_ERROR")
    moved = operator_client.patch(url, {"kind": "email", "target": "ops@example.org"}, format="json")
    assert moved.status_code == 200, moved.content
    path = "/api/v1/notification-channels/{id}"
    assert state_refusals("patch", path) == {"CONFLICTS_WITH_STORED": 409, "NAME_TAKEN": 409}
    assert "CONFLICTS_WITH_STORED" not in state_refusals("put", path)


@pytest.mark.django_db
@pytest.mark.parametrize("project", ["shop", " shop", "shop ", "\u3000shop", "sh op", "\tshop"])
def test_a_projects_surrounding_spaces_are_refused_as_its_schema_says(
    operator_client: Any, project: str
) -> None:
    # bench/fuzz: POST /project-limits with " shop" was a VALIDATION_ERROR (validate_project) for a value
    # the schema's pattern admitted.
    import re

    prop = DOCUMENT["components"]["schemas"]["ProjectLimitsRequest"]["properties"]["project"]
    admitted = re.search(prop["pattern"], project) is not None
    answer = operator_client.post("/api/v1/project-limits", {"project": project}, format="json")
    assert (answer.status_code == 201) == admitted, (project, prop["pattern"], answer.content)
