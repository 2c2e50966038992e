"""The OpenAI surface as the unmodified `openai` package uses it (issue 18): models listed and retrieved,
every answer naming the capability asked for (not the backend's name for its model), and an endpoint the
backends' engine does not serve refused by name before any backend is contacted. Real gunicorn, real
backend processes."""

from __future__ import annotations

import os
import signal

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai import OpenAI

from apps.clusters.models import Capability
from apps.clusters.tests.factories import bind, credential, echo_backend, loopback_node, running_server
from apps.gateway.gateway import _MODEL_FIELD, EventRenamer, renamed
from tests.fixtures import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@pytest.fixture
def echo(tmp_path):
    process, port = echo_backend(tmp_path, "echo-folder-name")
    yield port
    os.killpg(process.process.pid, signal.SIGTERM)
    process.process.wait(10)


def sdk(live_web, key: str) -> OpenAI:
    return OpenAI(base_url=live_web.url + "/v1", api_key=key, max_retries=0, timeout=20)


def test_models_are_listed_and_retrieved_for_the_credential_s_scopes_only(live_web, echo):
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-a", echo))
    Capability.objects.create(name="rag.embedding@1")
    key = credential(["chat.echo@1", "rag.embedding@1"])
    other = credential(["rag.embedding@1"])
    client = sdk(live_web, key)
    listed = client.models.list().data
    assert [m.id for m in listed] == ["chat.echo@1", "rag.embedding@1"]
    created = int(Capability.objects.get(name="chat.echo@1").created_at.timestamp())
    model = client.models.retrieve("chat.echo@1")
    assert (model.id, model.object, model.owned_by, model.created) == (
        "chat.echo@1",
        "model",
        "modelforge",
        created,
    )
    # Not in the credential's scopes, or not a capability at all: the same refusal (no oracle).
    for name in ("chat.echo@1", "nothing.here@1"):
        with pytest.raises(openai.AuthenticationError) as refused:
            sdk(live_web, other).models.retrieve(name)
        assert refused.value.response.json()["code"] == "CAPABILITY_NOT_AUTHORIZED"
    answer = httpx.post(live_web.url + "/v1/models/chat.echo@1", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 405 and answer.json()["code"] == "METHOD_NOT_ALLOWED"


def test_a_model_bound_only_for_another_project_is_refused_as_a_call_to_it_is(live_web, echo):
    # Regression (issue 47): models.retrieve answered 200 for a capability bound only for another project,
    # while a call to it was 401; the list named it too.
    server = running_server(loopback_node(), "echo-a", echo)
    bind("rag.private@1", server=server, project="team-a")
    bind("rag.open@1", server=server)
    scopes = ["rag.private@1", "rag.open@1"]
    team_a = credential(scopes, project="team-a")
    team_b = credential(scopes, project="team-b")
    no_project = credential(scopes)
    assert [m.id for m in sdk(live_web, team_a).models.list().data] == ["rag.open@1", "rag.private@1"]
    assert sdk(live_web, team_a).models.retrieve("rag.private@1").id == "rag.private@1"
    for key, project in ((team_b, "project 'team-b'"), (no_project, "no project")):
        client = sdk(live_web, key)
        with pytest.raises(openai.AuthenticationError) as retrieved:
            client.models.retrieve("rag.private@1")
        with pytest.raises(openai.AuthenticationError) as called:
            client.embeddings.create(model="rag.private@1", input="x")
        answers = [retrieved.value.response, called.value.response]
        assert {a.status_code for a in answers} == {401}
        assert {a.headers["www-authenticate"] for a in answers} == {'Bearer realm="modelforge-gateway"'}
        bodies = [a.json() for a in answers]
        assert {b["code"] for b in bodies} == {"CAPABILITY_NOT_AUTHORIZED"}
        assert bodies[0]["message"] == bodies[1]["message"] and project in bodies[0]["message"]
        # What the credential can call is what it is shown.
        assert [m.id for m in client.models.list().data] == ["rag.open@1"]
        assert client.models.retrieve("rag.open@1").id == "rag.open@1"
        assert client.embeddings.create(model="rag.open@1", input="x").model == "rag.open@1"


def test_every_answer_names_the_capability_not_the_backend_s_model(live_web, echo):
    server = running_server(loopback_node(), "echo-a", echo)
    bind("chat.echo@1", server=server)
    bind("rag.embedding@1", server=server)
    key = credential(["chat.echo@1", "rag.embedding@1"])
    client = sdk(live_web, key)
    # The backend itself answers with its own name for its model (the echo engine's --model).
    direct = httpx.post(
        f"http://127.0.0.1:{echo}/v1/embeddings", json={"model": "x", "input": "a"}, timeout=10
    ).json()
    assert direct["model"] == "echo-folder-name"
    raw = client.embeddings.with_raw_response.create(model="rag.embedding@1", input=["one", "two", "three"])
    embeddings = raw.parse()
    assert embeddings.model == "rag.embedding@1" and len(embeddings.data) == 3
    assert raw.headers["x-modelforge-backend"] == "echo-a"
    chat = client.chat.completions.create(model="chat.echo@1", messages=[{"role": "user", "content": "hi"}])
    assert chat.model == "chat.echo@1" and chat.choices[0].message.content == "echo: hi"
    chunks = list(
        client.chat.completions.create(
            model="chat.echo@1", stream=True, messages=[{"role": "user", "content": "one two three"}]
        )
    )
    assert len(chunks) > 3 and {c.model for c in chunks} == {"chat.echo@1"}
    words = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert words == "echo: one two three"


def test_an_endpoint_the_engine_does_not_serve_is_refused_before_any_backend(live_web):
    # The only backend listens nowhere: contacting it would be a 503 (nothing answered), not this 404.
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-gone", free_port()))
    key = credential(["chat.echo@1"])
    client = sdk(live_web, key)
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="chat.echo@1", prompt="The capital of France is")
    body = refused.value.response.json()
    assert body["code"] == "ENDPOINT_NOT_SERVED"
    assert "/v1/completions" in body["message"] and "/v1/chat/completions" in body["message"]
    # The credential is judged first: a caller without one learns nothing about the endpoints.
    with pytest.raises(openai.AuthenticationError):
        sdk(live_web, "mfc_" + "y" * 43).completions.create(model="chat.echo@1", prompt="x")


def test_events_that_name_one_model_are_renamed_by_the_field_first_seen_and_any_other_still_is():
    named = b'"chat.echo@1"'
    same = b'data: {"model":"gemma","choices":[{"delta":{"content":"w"}}]}\n\n'
    lookalike = b'data: {"model":"gemma","choices":[{"delta":{"content":"\\"model\\":\\"gemma\\""}}]}\n\n'
    other = b'data: {"model":"other","choices":[],"usage":null}\n\n'
    both = b'data: {"model":"gemma","x":{"model":"other"}}\n\n'
    stream = same * 3 + lookalike + other + both + same + b"data: [DONE]\n\n"
    expected = stream.replace(b'"model":"gemma"', b'"model":' + named).replace(
        b'"model":"other"', b'"model":' + named
    )
    for size in (1, 5, 64, len(stream)):
        events = EventRenamer(named)
        out = b"".join(events.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + events.rest()
        assert out == expected, size
        assert events.field == b'"model":"gemma"'  # learnt from the first event, used for the others
    assert b'\\"model\\":\\"gemma\\"' in expected  # the look-alike inside a string is left alone


# Pieces that make `"model"` keys, look-alikes (escaped quotes, a value "model", no colon) and runs of them.
_PIECES = st.sampled_from(
    [
        b'"model"',
        b":",
        b" ",
        b'"',
        b"\\",
        b"x",
        b'"m"',
        b"1.5,",
        b'\\"',
        b'"model":"',
        b"{",
        b"}",
        b'"model" :  "a\\"b"',
    ]
)


@given(
    body=st.lists(_PIECES, max_size=30).map(b"".join), named=st.sampled_from([b'"chat.echo@1"', b'"a\\\\b"'])
)
def test_renaming_finds_the_same_fields_as_the_expression_over_the_whole_body(
    body: bytes, named: bytes
) -> None:
    # The search for `"model"` and a match there: the same answer as the expression's own sub over the body.
    assert renamed(body, named) == _MODEL_FIELD.sub(b'"model":' + named.replace(b"\\", b"\\\\"), body)


def test_the_model_field_is_renamed_in_json_and_in_events_cut_anywhere():
    named = b'"chat.echo@1"'
    assert renamed(b'{"id":"x","model": "/models/gemma.gguf","data":[1]}', named) == (
        b'{"id":"x","model":"chat.echo@1","data":[1]}'
    )
    # A string that only looks like the field (its quotes are escaped inside JSON) is left alone.
    text = b'{"content":"say \\"model\\": \\"x\\"","model":"m"}'
    assert renamed(text, named) == b'{"content":"say \\"model\\": \\"x\\"","model":"chat.echo@1"}'
    assert renamed(b'{"object":"list"}', named) == b'{"object":"list"}'
    stream = (
        b"".join(
            b'data: {"model":"backend-%d","choices":[{"delta":{"content":"w%d"}}]}\n\n' % (i, i)
            for i in range(5)
        )
        + b"data: [DONE]\n\n"
    )
    expected = stream
    for i in range(5):
        expected = expected.replace(b'"backend-%d"' % i, named)
    for size in (1, 2, 7, 31, len(stream)):
        events = EventRenamer(named)
        out = b"".join(events.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + events.rest()
        assert out == expected, size
