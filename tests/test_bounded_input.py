"""Bounded input everywhere (issue 13, findings 5, 7 and 8): nesting depth, NUL characters, page sizes,
names without control or bidi-override characters, credentials not minted expired, and the lean
endpoints draining an oversized body before answering 413. No input is a 500."""

from __future__ import annotations

import json
import logging
import socket
from datetime import timedelta
from io import BytesIO
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver
from django.utils import timezone

from apps.artifacts.api.serializers import AmendSerializer, ReleaseSerializer
from apps.artifacts.models import Artifact
from apps.backups.api.serializers import RestoreRequestSerializer, ReviewSerializer
from apps.backups.models import Backup, Restore
from apps.clusters.models import Capability, ClientCredential, Cluster, ClusterMember
from apps.nodes.models import EnrollmentToken
from apps.nodes.tests.factories import heartbeat_report, make_node
from modelforge.lean import DRAIN_BYTES
from modelforge.parsers import MAX_JSON_DEPTH, BoundedJSONParser
from modelforge.urls import api_patterns

ENVELOPE_KEYS = {"code", "message", "correlation_id"}
HEARTBEAT = "/api/v1/agent/heartbeat"


def assert_envelope(response: Any, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, getattr(response, "content", response)
    body = json.loads(response.content)
    assert set(body) == ENVELOPE_KEYS, body
    assert body["code"] == code, body
    assert body["message"]
    return body


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def nested_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


# --- 1. Nesting depth ------------------------------------------------------------------------------


def _collection_posts() -> list[str]:
    """Every API address without a path parameter that takes a POST, from the URL resolver."""

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> list[tuple[str, Any]]:
        found: list[tuple[str, Any]] = []
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                found.extend(walk(pattern.url_patterns, prefix + str(pattern.pattern)))
            else:
                found.append((prefix + str(pattern.pattern), pattern.callback))
        return found

    paths = []
    for raw, callback in walk(api_patterns, ""):
        path = raw.replace("^", "").replace("$", "")
        if "<" in path or "(?P" in path:
            continue
        actions = getattr(callback, "actions", None)
        view = getattr(callback, "cls", None)
        if (actions and "post" in actions) or (not actions and view and hasattr(view, "post")):
            paths.append("/api/v1/" + path)
    return sorted(set(paths))


# These take no body (an operator's request to start something): what is sent is never parsed.
TAKES_NO_BODY = {"/api/v1/backups", "/api/v1/nodes/mass-loss/confirm", "/api/v1/system/worker-probe"}
COLLECTION_POSTS = [path for path in _collection_posts() if path not in TAKES_NO_BODY]


def test_the_resolver_finds_the_collection_endpoints():
    assert "/api/v1/agent/enroll" in COLLECTION_POSTS
    assert "/api/v1/clusters" in COLLECTION_POSTS
    assert len(COLLECTION_POSTS) >= 12
    assert set(_collection_posts()) >= TAKES_NO_BODY


@pytest.mark.django_db
def test_json_nested_5000_deep_is_refused_on_enroll_without_a_traceback(anonymous_client, caplog):
    # Regression: a RecursionError answered 500, unauthenticated, with 4.5 KB of traceback logged.
    caplog.set_level(logging.INFO)
    response = anonymous_client.post(
        "/api/v1/agent/enroll", data=nested(5000), content_type="application/json"
    )
    body = assert_envelope(response, 400, "JSON_TOO_DEEP")
    assert str(MAX_JSON_DEPTH) in body["message"]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.django_db
@pytest.mark.parametrize("path", COLLECTION_POSTS)
@pytest.mark.parametrize("body", [nested(5000), nested_objects(5000), nested(MAX_JSON_DEPTH + 1)])
def test_json_nested_too_deep_is_refused_on_every_endpoint(operator_client, path, body):
    response = operator_client.post(path, data=body, content_type="application/json")
    assert_envelope(response, 400, "JSON_TOO_DEEP")


def parse(body: bytes) -> Any:
    return BoundedJSONParser().parse(BytesIO(body), "application/json", {})


def test_the_parser_takes_json_as_deep_as_the_bound_and_brackets_inside_strings():
    assert parse(nested(MAX_JSON_DEPTH)) is not None
    assert parse(nested_objects(MAX_JSON_DEPTH))["a"]["a"]
    text = "[" * 5000 + "{" * 5000
    assert parse(json.dumps({"name": text, "list": [[1], [2], {"a": [3]}] * 100}).encode())["name"] == text


def test_the_parser_refuses_one_level_past_the_bound():
    from modelforge.errors import ApiError

    for body in (nested(MAX_JSON_DEPTH + 1), nested_objects(MAX_JSON_DEPTH + 1), b"[" * 5000):
        with pytest.raises(ApiError) as refused:
            parse(body)
        assert refused.value.code == "JSON_TOO_DEEP" and refused.value.status == 400


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
@pytest.mark.parametrize(
    "body",
    [
        nested(5000),
        b'{"gpus": ' + nested(5000) + b"}",
        b'{"agent_version": "x", "surprise": ' + nested(5000) + b"}",
    ],
)
def test_json_nested_5000_deep_is_a_400_on_the_heartbeat(live_web, body):
    _, credential = make_node()
    response = httpx.post(
        live_web.url + HEARTBEAT,
        content=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {credential}"},
    )
    assert_envelope(response, 400, "VALIDATION_ERROR")


# --- 2. NUL characters -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda r: r.update(agent_version="0.1\u0000"), "$.agent_version"),
        (lambda r: r.update(agent_url="http://10.0.0.5:8471/\u0000"), "$.agent_url"),
        (lambda r: r["gpus"][0].update(name="NVIDIA\u0000RTX"), "$.gpus[0].name"),
        (lambda r: r["gpus"][1].update(uuid="GPU-\u0000"), "$.gpus[1].uuid"),
        (lambda r: r["models_present"][0].update(name="bge\u0000small"), "$.models_present[0].name"),
    ],
)
def test_a_nul_in_any_heartbeat_string_is_a_400_and_the_next_heartbeat_counts(live_web, mutate, where):
    # Regression: PostgreSQL text cannot hold NUL; the heartbeat answered 500 and was lost.
    node, credential = make_node()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {credential}"}
    report = heartbeat_report()
    mutate(report)
    response = httpx.post(live_web.url + HEARTBEAT, content=json.dumps(report).encode(), headers=headers)
    body = assert_envelope(response, 400, "VALIDATION_ERROR")
    assert where in body["message"] and "NUL" in body["message"]
    node.refresh_from_db()
    assert node.last_heartbeat_at is None
    good = httpx.post(
        live_web.url + HEARTBEAT, content=json.dumps(heartbeat_report()).encode(), headers=headers
    )
    assert good.status_code == 200, good.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_the_text_backslash_u0000_in_a_heartbeat_is_not_a_nul(live_web):
    node, credential = make_node()
    report = heartbeat_report()
    report["models_present"][0]["name"] = "odd\\u0000name"
    response = httpx.post(
        live_web.url + HEARTBEAT,
        content=json.dumps(report).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {credential}"},
    )
    assert response.status_code == 200, response.text
    node.refresh_from_db()
    assert node.models_present[0]["name"] == "odd\\u0000name"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/api/v1/clusters", {"name\u0000": "x", "name": "c1"}, "A key of $"),
        ("/api/v1/clusters", {"name": "c1", "algorithm\u0000": "x"}, "A key of $"),
        (
            "/api/v1/artifacts",
            {
                "name": "m1",
                "source_kind": "http",
                "locator": "http://models.example/m.gguf",
                "expected_sha256": {"m.gguf": "\u0000" * 64},
            },
            "$.expected_sha256.m.gguf",
        ),
        (
            "/api/v1/artifacts",
            {
                "name": "m1",
                "source_kind": "http",
                "locator": "http://models.example/m.gguf",
                "expected_sha256": {"m\u0000.gguf": "a" * 64},
            },
            "A key of $.expected_sha256",
        ),
        ("/api/v1/agent/enroll", {"token": "t\u0000", "name": "n1"}, "$.token"),
        ("/api/v1/clusters", [{"deep": ["x", "y\u0000"]}], "$[0].deep[1]"),
    ],
)
def test_a_nul_in_a_json_key_or_value_is_a_400_naming_where(operator_client, path, body, where):
    # Regression: a NUL in a JSON key, or in a value stored as jsonb, answered 500.
    response = operator_client.post(path, data=json.dumps(body), content_type="application/json")
    message = assert_envelope(response, 400, "VALIDATION_ERROR")["message"]
    assert "NUL" in message and where in message, message


# --- 3. Page sizes and offsets ---------------------------------------------------------------------


def _list_endpoints() -> list[str]:
    paths = []
    stack: list[tuple[str, Any]] = [("", pattern) for pattern in api_patterns]
    while stack:
        prefix, pattern = stack.pop()
        if isinstance(pattern, URLResolver):
            stack.extend((prefix + str(pattern.pattern), p) for p in pattern.url_patterns)
        elif (getattr(pattern.callback, "actions", None) or {}).get("get") == "list":
            paths.append("/api/v1/" + (prefix + str(pattern.pattern)).replace("^", "").replace("$", ""))
    return sorted(paths)


LIST_ENDPOINTS = _list_endpoints()


def test_every_list_endpoint_is_found():
    assert len(LIST_ENDPOINTS) >= 14, LIST_ENDPOINTS


@pytest.mark.django_db
@pytest.mark.parametrize("path", LIST_ENDPOINTS)
@pytest.mark.parametrize(
    "query",
    [
        "limit=9223372036854775808",
        "limit=99999999999999999999999999",
        "limit=501",
        "limit=-1",
        "limit=0",
        "limit=ten",
        "limit=1.5",
        "offset=9223372036854775808",
        "offset=-1",
        "offset=ten",
        "limit=10&offset=99999999999999999999999999",
    ],
)
def test_a_limit_or_offset_out_of_range_is_a_400_on_every_list_endpoint(operator_client, path, query):
    # Regression: ?limit=9223372036854775808 answered 500 on 14 list endpoints.
    response = operator_client.get(f"{path}?{query}")
    message = assert_envelope(response, 400, "VALIDATION_ERROR")["message"]
    assert query.split("=")[-2].split("&")[-1] in message


@pytest.mark.django_db
@pytest.mark.parametrize("path", LIST_ENDPOINTS)
def test_the_largest_page_is_answered_on_every_list_endpoint(operator_client, path):
    response = operator_client.get(f"{path}?limit=500&offset=9223372036854775807")
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []


@pytest.mark.django_db
def test_the_default_page_is_50_and_the_maximum_follows_the_setting(operator_client, settings):
    Cluster.objects.bulk_create(Cluster(name=f"c{i:03d}") for i in range(60))
    assert len(operator_client.get("/api/v1/clusters").json()["results"]) == 50
    assert len(operator_client.get("/api/v1/clusters?limit=60").json()["results"]) == 60
    settings.API_MAX_PAGE_SIZE = 20
    assert_envelope(operator_client.get("/api/v1/clusters?limit=21"), 400, "VALIDATION_ERROR")
    assert len(operator_client.get("/api/v1/clusters").json()["results"]) == 20


# --- 4. /metrics answers only GET and HEAD ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["options", "post", "put", "patch", "delete"])
def test_metrics_answers_other_methods_with_a_405_naming_get_and_head(operator_client, method):
    # Regression: OPTIONS /metrics answered 500 (the Prometheus renderer cannot render the metadata).
    response = getattr(operator_client, method)("/metrics")
    assert_envelope(response, 405, "METHOD_NOT_ALLOWED")
    assert {m.strip() for m in response["Allow"].split(",")} == {"GET", "HEAD"}


@pytest.mark.django_db
def test_metrics_still_answers_get_and_head(operator_client):
    assert operator_client.get("/metrics").status_code == 200
    assert operator_client.head("/metrics").status_code == 200


# --- 5. Names: printable, no bidi overrides --------------------------------------------------------

UNPRINTABLE = [
    "\x07",  # BEL
    "\x1b[31m",  # an ANSI escape: ESC
    "\n",
    "\t",
    "\x7f",  # DEL
    "\x85",  # NEL, a C1 control
    "\u202a",
    "\u202b",
    "\u202c",
    "\u202d",
    "\u202e",  # RIGHT-TO-LEFT OVERRIDE: "exe.txt" reads "txt.exe"
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
    "\u200e",
    "\u200f",
    "\u061c",
    "\u2028",
]


@pytest.fixture
def related(db) -> dict[str, Any]:
    capability = Capability.objects.create(name="rag.embedding@1")
    cluster = Cluster.objects.create(name="cl")
    return {"capability": capability.pk, "cluster": cluster.pk}


def _name_cases() -> list[tuple[str, str, Any]]:
    artifact = {"name": "m1", "source_kind": "http", "locator": "http://models.example/m.gguf"}
    credential = {"name": "app", "scopes": ["rag.embedding@1"]}
    channel = {"name": "ops", "kind": "webhook", "target": "http://hooks.example/x"}
    enroll = {
        "token": "t",
        "name": "gpu-01",
        "accelerator": "cpu",
        "agent_version": "0.1.0",
        "agent_url": "http://gpu-01:8471",
    }
    return [
        ("/api/v1/clusters", "name", lambda r, v: {"name": v}),
        ("/api/v1/cluster-members", "name", lambda r, v: {"cluster": r["cluster"], "name": v}),
        ("/api/v1/capabilities", "description", lambda r, v: {"name": "chat.x@1", "description": v}),
        ("/api/v1/client-credentials", "name", lambda r, v: {**credential, "name": v}),
        ("/api/v1/client-credentials", "project", lambda r, v: {**credential, "project": v}),
        ("/api/v1/notification-channels", "name", lambda r, v: {**channel, "name": v}),
        (
            "/api/v1/notification-channels",
            "target",
            lambda r, v: {**channel, "target": channel["target"] + v},
        ),
        ("/api/v1/enrollment-tokens", "note", lambda r, v: {"note": v}),
        ("/api/v1/artifacts", "name", lambda r, v: {**artifact, "name": v}),
        ("/api/v1/artifacts", "locator", lambda r, v: {**artifact, "locator": artifact["locator"] + v}),
        ("/api/v1/artifacts", "revision", lambda r, v: {**artifact, "revision": v}),
        ("/api/v1/artifacts", "licence", lambda r, v: {**artifact, "licence": v}),
        (
            "/api/v1/routing-tiers",
            "project",
            lambda r, v: {"capability": r["capability"], "cluster": r["cluster"], "project": v},
        ),
        ("/api/v1/agent/enroll", "agent_version", lambda r, v: {**enroll, "agent_version": v}),
        ("/api/v1/agent/enroll", "agent_url", lambda r, v: {**enroll, "agent_url": enroll["agent_url"] + v}),
        ("/api/v1/servers", "profile", lambda r, v: {"name": "s1", "profile": v, "model": "m"}),
        ("/api/v1/servers", "node", lambda r, v: {"name": "s1", "profile": "p", "model": "m", "node": v}),
    ]


NAME_CASES = _name_cases()


@pytest.mark.parametrize(("path", "field", "body"), NAME_CASES, ids=[f"{p}:{f}" for p, f, _ in NAME_CASES])
@pytest.mark.parametrize("char", ["\u202e", "\x1b"], ids=["RLO", "ESC"])
def test_every_operator_chosen_name_refuses_control_and_bidi_characters(
    operator_client, related, path, field, body, char
):
    response = operator_client.post(path, body(related, f"evil{char}txt.exe"), format="json")
    message = assert_envelope(response, 400, "VALIDATION_ERROR")["message"]
    assert f"{field}:" in message and "U+" in message, message


@pytest.mark.django_db
@pytest.mark.parametrize("char", UNPRINTABLE, ids=[f"U+{ord(c[0]):04X}" for c in UNPRINTABLE])
def test_a_cluster_name_refuses_each_control_and_bidi_character(operator_client, char):
    response = operator_client.post("/api/v1/clusters", {"name": f"a{char}b"}, format="json")
    assert_envelope(response, 400, "VALIDATION_ERROR")
    assert not Cluster.objects.exists()


@pytest.mark.django_db
def test_names_in_any_script_are_still_names(operator_client, related):
    for name in ("Équipe-ü", "日本語クラスタ", "אשכול", "team 👩\u200d💻"):
        response = operator_client.post("/api/v1/clusters", {"name": name}, format="json")
        assert response.status_code == 201, response.content
    member = operator_client.post(
        "/api/v1/cluster-members", {"cluster": related["cluster"], "name": "primär"}, format="json"
    )
    assert member.status_code == 201, member.content


@pytest.mark.django_db
def test_renaming_is_held_to_the_same_rule(operator_client, related):
    cluster = Cluster.objects.get(pk=related["cluster"])
    member = ClusterMember.objects.create(cluster=cluster, name="m")
    for path, body in (
        (f"/api/v1/clusters/{cluster.pk}", {"name": "a\u202eb"}),
        (f"/api/v1/cluster-members/{member.pk}", {"name": "a\u2067b"}),
    ):
        assert_envelope(operator_client.patch(path, body, format="json"), 400, "VALIDATION_ERROR")
    assert Cluster.objects.get(pk=cluster.pk).name == "cl"


@pytest.mark.parametrize(
    "serializer", [ReleaseSerializer, AmendSerializer, ReviewSerializer], ids=lambda s: s.__name__
)
def test_free_text_keeps_its_lines_but_refuses_bidi_and_other_controls(serializer):
    assert serializer(data={"reason": "checked by hand\nsee ticket 12\ttoday"}).is_valid()
    for char in ("\u202e", "\u2066", "\x1b", "\x00", "\x7f"):
        refused = serializer(data={"reason": f"ok{char}"})
        assert not refused.is_valid()
        assert "reason" in refused.errors


@pytest.mark.django_db
def test_a_restore_reason_is_free_text_too():
    refused = RestoreRequestSerializer(data={"reason": "drill \u202e"})
    assert not refused.is_valid() and "reason" in refused.errors


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


@pytest.mark.django_db
def test_the_dashboard_refuses_the_same_names(staff):
    staff.post("/clusters/create", {"name": "evil\u202etxt.exe"})
    assert not Cluster.objects.exists()
    page = staff.get("/clusters/").content.decode()
    assert "VALIDATION_ERROR" in page
    staff.post("/nodes/enrollment-tokens/", {"note": "laptop\u202e"})
    assert not EnrollmentToken.objects.exists()
    staff.post("/nodes/enrollment-tokens/", {"note": "rack 3, slot 2"})
    assert EnrollmentToken.objects.get().note == "rack 3, slot 2"


@pytest.mark.django_db
@pytest.mark.parametrize("char", ["\x00", "\u202e"], ids=["NUL", "RLO"])
def test_the_dashboards_free_text_reasons_are_held_to_the_rule(staff, char):
    # Regression: a NUL in a dashboard reason reached a text column (a 500); a bidi override was kept.
    artifact = Artifact.objects.create(
        name="m1", source_kind="http", locator="http://models.example/m.gguf", state="quarantined"
    )
    page = staff.post(f"/artifacts/{artifact.pk}/release", {"reason": f"checked{char}"}, follow=True)
    assert "VALIDATION_ERROR: Invalid input: reason: Contains U+" in page.content.decode()
    assert Artifact.objects.get(pk=artifact.pk).state == "quarantined"
    backup = Backup.objects.create(state="verified")
    page = staff.post(f"/backups/{backup.pk}/restore", {"reason": f"drill{char}"}, follow=True)
    assert "VALIDATION_ERROR: Invalid input: reason: Contains U+" in page.content.decode()
    assert not Restore.objects.exists()


# --- 6. Credentials are not minted expired ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("ago", [timedelta(seconds=1), timedelta(days=400)])
def test_a_credential_cannot_be_minted_already_expired(operator_client, related, ago):
    response = operator_client.post(
        "/api/v1/client-credentials",
        {"name": "app", "scopes": ["rag.embedding@1"], "expires_at": (timezone.now() - ago).isoformat()},
        format="json",
    )
    assert "expires_at:" in assert_envelope(response, 400, "EXPIRY_IN_PAST")["message"]
    assert not ClientCredential.objects.exists()


@pytest.mark.django_db
def test_a_credential_expiring_in_the_future_is_minted(operator_client, related):
    response = operator_client.post(
        "/api/v1/client-credentials",
        {
            "name": "app",
            "scopes": ["rag.embedding@1"],
            "expires_at": (timezone.now() + timedelta(minutes=5)).isoformat(),
        },
        format="json",
    )
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_the_dashboard_cannot_mint_an_expired_credential(staff, related):
    staff.post(
        "/clusters/credentials/mint", {"name": "app", "scopes": ["rag.embedding@1"], "expires_in_days": "0"}
    )
    assert not ClientCredential.objects.exists()
    assert "VALIDATION_ERROR" in staff.get("/clusters/").content.decode()


# --- 7. The lean endpoints drain an oversized body before answering 413 ----------------------------


def send_then_read(
    url: str, path: str, total: int, *, chunked: bool = False, send: int | None = None
) -> bytes:
    """A client that writes its whole body before reading (``Connection: close``, as urllib sends):
    returns what it reads; a reset while writing or reading fails the test."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Authorization: Bearer mfn_nobody\r\nConnection: close\r\n"
        + ("Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {total}\r\n")
        + "\r\n"
    )
    block = b"[" * 65536
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        sent = 0
        while sent < (total if send is None else send):
            piece = block[: min(len(block), total - sent)]
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            sent += len(piece)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def envelope_of(answer: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        chunks = b""
        while True:
            size, _, rest = body.partition(b"\r\n")
            if not int(size, 16):
                break
            chunks, body = chunks + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
        body = chunks
    return int(lines[0].split()[1]), headers, json.loads(body)


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    "path", [HEARTBEAT, "/v1/chat/completions", "/api/v1/agent/artifacts/1/files/model.gguf"]
)
def test_a_client_that_writes_10_mb_then_reads_gets_the_413_envelope(live_web, path, chunked):
    # Regression: the lean endpoints answered and closed mid-body; the client saw a connection reset.
    status, _, body = envelope_of(send_then_read(live_web.url, path, 10 * 2**20, chunked=chunked))
    expected = (404, "NOT_FOUND") if "/artifacts/" in path else (413, "PAYLOAD_TOO_LARGE")
    assert (status, body["code"]) == expected, body
    assert set(body) == ENVELOPE_KEYS


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_body_declared_beyond_the_drain_bound_is_refused_at_once_and_the_connection_closed(live_web):
    answer = send_then_read(live_web.url, HEARTBEAT, DRAIN_BYTES + 1, send=0)
    status, headers, body = envelope_of(answer)
    assert (status, body["code"]) == (413, "PAYLOAD_TOO_LARGE")
    assert headers["connection"] == "close"


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
@pytest.mark.parametrize("path", [HEARTBEAT, "/v1/chat/completions"])
def test_a_kept_alive_connection_declaring_a_body_beyond_the_drain_bound_is_answered_and_closed(
    live_web, path
):
    # The client asks to keep the connection and sends none of the body it declared: the server answers
    # at once and closes, rather than reading (and throwing away) whatever length was declared.
    host, port = live_web.url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer mfn_nobody\r\nContent-Length: {DRAIN_BYTES * 64}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode())
        answer = b""
        while chunk := sock.recv(65536):  # ends only when the server closes (a timeout fails the test)
            answer += chunk
    status, headers, body = envelope_of(answer)
    assert (status, body["code"]) == (413, "PAYLOAD_TOO_LARGE")
    assert headers["connection"] == "close"


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_urllib_sees_the_413_envelope_for_a_10_mb_heartbeat(live_web):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        live_web.url + HEARTBEAT,
        data=b"{" * (10 * 2**20),
        headers={"Content-Type": "application/json", "Authorization": "Bearer mfn_nobody"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413
    assert json.loads(refused.value.read())["code"] == "PAYLOAD_TOO_LARGE"
