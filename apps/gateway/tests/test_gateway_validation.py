"""The gateway checks the OpenAI request shape before any backend is contacted (issue 13, finding 4, and
the gateway's share of finding 5), and a backend's 4xx never benches it.

Over real HTTP: the web process under gunicorn, and a real backend (an HTTP server in a thread of the
test) that counts every request reaching it, answers OpenAI-shaped bodies, and can be told to answer
every request with one status."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from openai import OpenAI

from apps.clusters.tests.factories import bind, credential, loopback_node, running_server
from apps.gateway.lbstate import BENCH_KEY, FAILS_KEY
from apps.gateway.shapes import MAX_INPUTS, MAX_TOKENS
from modelforge.jsonbounds import MAX_JSON_DEPTH
from tests.fixtures import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

CHAT, EMBEDDINGS, COMPLETIONS = "/v1/chat/completions", "/v1/embeddings", "/v1/completions"
ENVELOPE_KEYS = {"code", "message", "correlation_id"}


class CountingBackend:
    """A real model server over HTTP/1.1 (keep-alive, chunked streams) that records each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.status = 200  # anything else: every request is answered with it
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1})
        self.thread.start()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def forget(self) -> None:
        with self._lock:
            self.requests.clear()

    def last(self) -> tuple[str, dict[str, Any]]:
        with self._lock:
            return self.requests[-1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # the gateway's health probe (apps/gateway/probe.py): not counted
                self._json(200, {"status": "ok"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if self.headers.get("X-ModelForge-Probe") is None:  # the space probe of a new binding
                    with backend._lock:
                        backend.requests.append((self.path, body))
                if backend.status != 200:
                    self._json(backend.status, {"error": {"message": f"answered {backend.status}"}})
                elif self.path == EMBEDDINGS:
                    items = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    data = [
                        {"object": "embedding", "index": i, "embedding": [0.5, 0.25]}
                        for i in range(len(items))
                    ]
                    self._json(200, {"object": "list", "model": "m", "data": data, "usage": _usage()})
                elif self.path == COMPLETIONS:
                    choice = {"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}
                    self._json(
                        200,
                        {
                            "id": "c1",
                            "object": "text_completion",
                            "created": 1,
                            "model": "m",
                            "choices": [choice],
                        },
                    )
                elif body.get("stream"):
                    self._stream()
                else:
                    message = {"role": "assistant", "content": "ok"}
                    choice = {"index": 0, "finish_reason": "stop", "message": message}
                    self._json(
                        200,
                        {
                            "id": "c1",
                            "object": "chat.completion",
                            "created": 1,
                            "model": "m",
                            "choices": [choice],
                        },
                    )

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for delta, finish in (
                    ({"role": "assistant", "content": "o"}, None),
                    ({"content": "k"}, "stop"),
                ):
                    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
                    chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
                    self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 1, "total_tokens": 1}


@pytest.fixture
def backend() -> Iterator[CountingBackend]:
    started = CountingBackend()
    yield started
    started.stop()


@pytest.fixture
def routed(live_web, backend) -> tuple[str, str]:
    """Chat, completions and embeddings capabilities served by the counting backend; a credential for
    all three (returned with the backend's server key), every route answering."""
    server = running_server(loopback_node(), "counted", backend.port)
    # The counting backend serves chat, completions and embeddings: a profile no manifest defines keeps
    # every endpoint (the shipped test profile declares chat and embeddings only).
    server.profile = "counting-backend"
    server.save(update_fields=["profile"])
    for capability in ("chat.general@1", "text.general@1", "rag.embedding@1"):
        bind(capability, server=server)
    key = credential(["chat.general@1", "text.general@1", "rag.embedding@1"])
    assert wait_until(
        lambda: (
            post(live_web, EMBEDDINGS, {"model": "rag.embedding@1", "input": "x"}, key).status_code == 200
        ),
        15,
    )
    backend.forget()
    return key, str(server.pk)


def post(live_web, path: str, body: Any, key: str | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(live_web.url + path, content=content, headers=headers, timeout=10)


def refusal(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == ENVELOPE_KEYS and body["code"] == code, body
    assert body["correlation_id"] == response.headers["x-correlation-id"]
    return str(body["message"])


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "chat.general@1", "messages": [{"role": "user", "content": "Hi"}], **fields}


def embed(**fields: Any) -> dict[str, Any]:
    return {"model": "rag.embedding@1", "input": "Hi", **fields}


def complete(**fields: Any) -> dict[str, Any]:
    return {"model": "text.general@1", "prompt": "Hi", **fields}


MESSAGES_RULE = "messages must be a non-empty list of message objects"
# (route, body, a phrase the message must hold): each one a 400 VALIDATION_ERROR.
BAD_SHAPES: list[tuple[str, Any, str]] = [
    # Regression: {"messages": 5} made the engine fail; five such requests benched it for 30 s.
    (CHAT, chat(messages=5), MESSAGES_RULE),
    (CHAT, chat(messages="Hi"), MESSAGES_RULE),
    (CHAT, chat(messages=[]), MESSAGES_RULE),
    (CHAT, chat(messages=["Hi"]), "at $.messages[0], expected `object`, got `str`"),
    (CHAT, chat(messages=[{"content": "Hi"}]), "missing required field `role`"),
    (CHAT, chat(messages=[{"role": 1, "content": "Hi"}]), "at $.messages[0].role"),
    (CHAT, chat(messages=[{"role": "", "content": "Hi"}]), "at $.messages[0].role"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), "at $.messages[0].content"),
    (CHAT, chat(messages=[{"role": "user", "content": {"text": "Hi"}}]), "at $.messages[0].content"),
    (CHAT, chat(messages=[{"role": "user", "content": [5]}]), "at $.messages[0].content[0]"),
    (CHAT, chat(messages=[{"role": "user", "content": [{"text": "Hi"}]}]), "missing required field `type`"),
    (CHAT, {"model": "chat.general@1"}, "messages is missing"),
    (CHAT, chat(max_tokens=0), "max_tokens must be a whole number from 1"),
    (CHAT, chat(max_tokens=-1), "max_tokens must be"),
    (CHAT, chat(max_tokens="16"), "max_tokens must be"),
    (CHAT, chat(max_tokens=1.5), "max_tokens must be"),
    (CHAT, chat(max_tokens=True), "max_tokens must be"),
    (CHAT, chat(max_tokens=MAX_TOKENS + 1), "max_tokens must be"),
    (CHAT, chat(max_tokens=2**70), "max_tokens must be"),
    (CHAT, chat(max_completion_tokens=0), "max_completion_tokens must be"),
    (CHAT, chat(n=0), "n must be a whole number from 1 to 128"),
    (CHAT, chat(n=129), "n must be"),
    (CHAT, chat(temperature="hot"), "temperature must be a number from 0 to 2"),
    (CHAT, chat(temperature=2.5), "temperature must be"),
    (CHAT, chat(temperature=-0.1), "temperature must be"),
    (
        CHAT,
        b'{"model": "chat.general@1", "messages": [{"role": "user"}], "temperature": 1e400}',
        "temperature",
    ),
    (CHAT, chat(top_p=1.5), "top_p must be a number from 0 to 1"),
    (CHAT, chat(presence_penalty=3), "presence_penalty must be"),
    (CHAT, chat(stream="yes"), "stream must be true, false or null"),
    (CHAT, chat(stream=1), "stream must be"),
    (CHAT, chat(stream_options=True), "stream_options must be"),
    (CHAT, chat(stop=5), "stop must be a string, a list of strings"),
    (CHAT, chat(stop=["a", 1]), "at $.stop[1]"),
    (CHAT, chat(seed=2**64), "seed must be"),
    (CHAT, chat(top_logprobs=21), "top_logprobs must be"),
    (CHAT, chat(user=5), "user must be a string"),
    (EMBEDDINGS, embed(input=5), "input must be a string, a list of strings"),
    (EMBEDDINGS, embed(input={"text": "Hi"}), "input must be"),
    (EMBEDDINGS, embed(input=""), "a string may not be empty"),
    (EMBEDDINGS, embed(input=[]), "input must be"),
    (EMBEDDINGS, embed(input=["Hi", ""]), "at $.input[1]"),
    (EMBEDDINGS, embed(input=["Hi", 1]), "mixes kinds of items"),
    (EMBEDDINGS, embed(input=[[1, 2], 3]), "mixes kinds of items"),
    (EMBEDDINGS, embed(input=[[]]), "at $.input[0]"),
    (EMBEDDINGS, embed(input=[-1]), "at $.input[0]"),
    (EMBEDDINGS, embed(input=[1.5]), "at $.input[0]"),
    (EMBEDDINGS, embed(input=[[1, None]]), "at $.input[0][1]"),
    (EMBEDDINGS, embed(input=["x"] * (MAX_INPUTS + 1)), f"with 1 to {MAX_INPUTS} items"),
    (EMBEDDINGS, {"model": "rag.embedding@1"}, "input is missing"),
    (EMBEDDINGS, embed(encoding_format="hex"), 'encoding_format must be "float", "base64" or null'),
    (EMBEDDINGS, embed(dimensions=0), "dimensions must be"),
    (COMPLETIONS, complete(prompt=5), "prompt must be a string"),
    (COMPLETIONS, complete(prompt=["a", [1]]), "mixes kinds of items"),
    (COMPLETIONS, {"model": "text.general@1"}, "prompt is missing"),
    (COMPLETIONS, complete(max_tokens=0), "max_tokens must be"),
    (COMPLETIONS, complete(echo="yes"), "echo must be"),
    # Not an object with a model: the refusal that names model.
    (CHAT, [chat()], '"model": "<capability>"'),
    (EMBEDDINGS, "Hi", '"model": "<capability>"'),
    (EMBEDDINGS, 5, '"model": "<capability>"'),
    (EMBEDDINGS, None, '"model": "<capability>"'),
    (EMBEDDINGS, {"input": "Hi"}, '"model": "<capability>"'),
    (EMBEDDINGS, embed(model=["rag.embedding@1"]), '"model": "<capability>"'),
]


def test_each_bad_shape_is_a_400_naming_the_field_and_reaches_no_backend(live_web, routed, backend):
    key, _ = routed
    wrong = []
    for path, body, phrase in BAD_SHAPES:
        response = post(live_web, path, body, key)
        message = refusal(response, 400, "VALIDATION_ERROR")
        if phrase not in message:
            wrong.append((path, body if len(str(body)) < 200 else "…", message))
    assert not wrong, wrong
    assert backend.count == 0
    # The same route, shaped right, reaches it: nothing above was refused for want of a backend.
    assert post(live_web, CHAT, chat(), key).status_code == 200
    assert backend.count == 1


def test_a_body_that_is_not_json_is_malformed_and_reaches_no_backend(live_web, routed, backend):
    key, _ = routed
    for body in (b"", b"{", b'{"model": "chat.general@1",}', b"\x00", b'{"model": "chat\x00"}', b"\xff\xfe"):
        refusal(post(live_web, CHAT, body, key), 400, "MALFORMED_REQUEST")
    assert backend.count == 0


def nested(depth: int, opening: bytes = b"[", closing: bytes = b"]") -> bytes:
    return opening * depth + closing * depth


def test_json_nested_5000_deep_is_a_400_not_a_500_wherever_it_is(live_web, routed, backend):
    key, _ = routed
    deep = nested(5000)
    bodies = [
        deep,
        b'{"model": "chat.general@1", "messages": [{"role": "user", "content": "Hi"}], "extra": '
        + deep
        + b"}",
        b'{"model": ' + deep + b"}",
        b'{"model": "chat.general@1", "messages": ' + deep + b"}",
        b'{"a": ' * 5000 + b"1" + b"}" * 5000,
        b'{"model": "chat.general@1", "extra": ' + b"[" * 5000,  # and never closed
    ]
    for body in bodies:
        message = refusal(post(live_web, CHAT, body, key), 400, "JSON_TOO_DEEP")
        assert str(MAX_JSON_DEPTH) in message
    # Regression: unauthenticated, it was a RecursionError and a 500 with a traceback.
    refusal(post(live_web, EMBEDDINGS, deep), 400, "JSON_TOO_DEEP")
    assert backend.count == 0


def test_the_depth_bound_is_exact_and_brackets_inside_strings_are_text(live_web, routed, backend):
    key, _ = routed
    # The body is one level, so the field holds MAX_JSON_DEPTH - 1: as deep as allowed, forwarded.
    start = b'{"model": "chat.general@1", "messages": [{"role": "user"}], "extra": '
    assert post(live_web, CHAT, start + nested(MAX_JSON_DEPTH - 1) + b"}", key).status_code == 200
    refusal(post(live_web, CHAT, start + nested(MAX_JSON_DEPTH) + b"}", key), 400, "JSON_TOO_DEEP")
    text = "[" * 5000 + '{"' * 100
    response = post(live_web, CHAT, chat(messages=[{"role": "user", "content": text}]), key)
    assert response.status_code == 200, response.text
    assert backend.count == 2 and backend.last()[1]["messages"][0]["content"] == text


def test_a_nul_character_is_refused_where_it_is_and_the_text_backslash_u0000_is_not(
    live_web, routed, backend
):
    key, _ = routed
    cases = [
        (chat(messages=[{"role": "user", "content": "a\u0000b"}]), "$.messages[0].content"),
        (chat(messages=[{"role": "user\u0000", "content": "Hi"}]), "$.messages[0].role"),
        (chat(metadata={"k": ["x", "\u0000"]}), "$.metadata.k[1]"),
        (chat(**{"extra\u0000": 1}), "A key of $"),
        (embed(input=["ok", "\u0000"]), "$.input[1]"),
    ]
    for body, where in cases:
        message = refusal(
            post(live_web, CHAT if "messages" in body else EMBEDDINGS, body, key), 400, "VALIDATION_ERROR"
        )
        assert where in message and "NUL" in message, message
    assert backend.count == 0
    # A backslash followed by u0000 is text, not a NUL: forwarded as sent.
    for text in ("\\u0000", "\\\\u0000 and \\"):
        assert (
            post(live_web, CHAT, chat(messages=[{"role": "user", "content": text}]), key).status_code == 200
        )
        assert backend.last()[1]["messages"][0]["content"] == text


def sin_bin(server_key: str) -> tuple[dict[str, Any] | None, int]:
    store = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    bench = store.hget(BENCH_KEY, server_key)
    fails = store.get(FAILS_KEY.format(key=server_key))
    return (json.loads(bench) if bench else None), int(fails or 0)


def test_a_backend_answering_4xx_is_never_benched_and_one_answering_5xx_still_is(live_web, routed, backend):
    key, server_key = routed
    streak = settings.LB_CONSECUTIVE_FAILURES
    # A 5xx streak one short of the bench, then the backend's own refusals: they end the streak.
    backend.status = 500
    for _ in range(streak - 1):
        refusal(post(live_web, EMBEDDINGS, embed(), key), 502, "UPSTREAM_FAILED")
    assert sin_bin(server_key) == (None, streak - 1)
    for status in (400, 422, 404, 429):
        backend.status = status
        for _ in range(3 * streak):
            message = refusal(post(live_web, EMBEDDINGS, embed(), key), status, "UPSTREAM_REJECTED")
            assert f"answered {status}" in message
    assert backend.count == streak - 1 + 4 * 3 * streak  # every one reached it
    assert sin_bin(server_key) == (None, 0)
    # 5xx still count: a streak of them benches it.
    backend.status = 500
    for _ in range(streak):
        refusal(post(live_web, EMBEDDINGS, embed(), key), 502, "UPSTREAM_FAILED")
    bench, _ = sin_bin(server_key)
    assert bench is not None and "last: HTTP 500" in bench["reason"] and bench["until"] > time.time()


def test_the_openai_sdk_passes_the_checks_for_chat_stream_completions_and_embeddings(
    live_web, routed, backend
):
    key, _ = routed
    client = OpenAI(base_url=live_web.url + "/v1", api_key=key, max_retries=0, timeout=20)
    answer = client.chat.completions.create(
        model="chat.general@1",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "42"},
        ],
        max_tokens=16,
        max_completion_tokens=16,
        n=1,
        temperature=0.7,
        top_p=1,
        presence_penalty=0,
        frequency_penalty=0.5,
        stop=["\n\n"],
        seed=7,
        logprobs=False,
        user="someone",
        tools=[
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        response_format={"type": "json_object"},
        extra_body={"top_k": 20, "repetition_penalty": 1.1},  # an engine's own extensions pass through
    )
    assert answer.choices[0].message.content == "ok"
    path, sent = backend.last()
    assert (
        path == CHAT
        and sent["max_tokens"] == 16
        and sent["top_k"] == 20
        and sent["tools"][0]["function"]["name"] == "f"
    )
    chunks = client.chat.completions.create(
        model="chat.general@1",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
        stop="\n",
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    embedded = client.embeddings.create(
        model="rag.embedding@1", input=["one", "two"]
    )  # base64 asked by default
    assert [e.embedding for e in embedded.data] == [[0.5, 0.25], [0.5, 0.25]]
    by_tokens = client.embeddings.create(
        model="rag.embedding@1", input=[[1, 2, 3], [4]], encoding_format="float"
    )
    assert len(by_tokens.data) == 2
    completed = client.completions.create(model="text.general@1", prompt=[1, 2, 3], max_tokens=8, echo=False)
    assert completed.choices[0].text == "ok"
    assert backend.count == 5
