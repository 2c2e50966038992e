"""Usage per credential (issue 18): counted by the gateway from the engines' own usage, with no database
write per request, flushed to Redis once a second, rolled up per minute onto the observability alias, and
read back through the API, its CSV and the dashboard. Real gunicorn, backend processes, Redis and
PostgreSQL; the `openai` package unmodified."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from msgspec import UNSET
from openai import APIStatusError, OpenAI

from apps.clusters.limits import current_use
from apps.clusters.models import ClientCredential
from apps.clusters.tests.factories import bind, credential, echo_backend, loopback_node, running_server
from apps.gateway.lbstate import SharedState
from apps.gateway.resp import LeanRedis
from apps.gateway.shapes import ChatCompletion, checked
from apps.gateway.usage import SEP, USAGE_KEY, Outbox, asking_for_usage, split_field, usage_in
from apps.observability.models import UsageSample
from apps.observability.sampling import roll_up_usage
from tests.fixtures import clear_limit_counts, clear_usage, free_port, run_in_own_loop, wait_until

pytestmark = [
    pytest.mark.django_db(databases=["default", "observability"], transaction=True),
    pytest.mark.stack,
]


@pytest.fixture
def echo(tmp_path):
    clear_usage()
    clear_limit_counts()
    process, port = echo_backend(tmp_path, "echo-u")
    yield port
    os.killpg(process.process.pid, signal.SIGTERM)
    process.process.wait(10)


def counted(credential_id: str) -> Counter[str]:
    """What the gateway has flushed to Redis for one credential, per capability and metric."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    totals: Counter[str] = Counter()
    now = int(time.time() // 60)
    for bucket in (now - 1, now):
        for raw, value in client.hgetall(USAGE_KEY.format(bucket=bucket)).items():
            parts = split_field(raw.decode() if isinstance(raw, bytes) else raw)
            if parts and parts[0] == credential_id:
                totals[f"{parts[2]}:{parts[4]}"] += int(value)
    return totals


def test_usage_is_counted_per_credential_and_rolled_up_per_minute(live_web, echo, operator_client, client):
    server = running_server(loopback_node(), "echo-u", echo)
    bind("chat.echo@1", server=server)
    bind("rag.embedding@1", server=server)
    key = credential(["chat.echo@1", "rag.embedding@1"])
    other = credential(["chat.echo@1"])
    ids = {k: str(ClientCredential.objects.get(display_prefix=k[:12]).pk) for k in (key, other)}
    sdk = OpenAI(base_url=live_web.url + "/v1", api_key=key, max_retries=0, timeout=20)

    embedded = sdk.embeddings.create(model="rag.embedding@1", input=["one", "two", "three"])
    assert embedded.usage.prompt_tokens == 3
    chat = sdk.chat.completions.create(model="chat.echo@1", messages=[{"role": "user", "content": "a b c"}])
    assert chat.usage is not None and (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (3, 4)
    # A stream whose client did not ask for usage: counted all the same, and no usage chunk reaches it.
    plain = list(
        sdk.chat.completions.create(
            model="chat.echo@1", stream=True, messages=[{"role": "user", "content": "d e"}]
        )
    )
    assert plain and all(c.choices for c in plain) and all(c.usage is None for c in plain)
    # A client that asked gets the usage chunk, as OpenAI sends it.
    asked = list(
        sdk.chat.completions.create(
            model="chat.echo@1",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "f g h i"}],
        )
    )
    assert asked[-1].choices == [] and asked[-1].usage is not None
    assert (asked[-1].usage.prompt_tokens, asked[-1].usage.completion_tokens) == (4, 5)
    OpenAI(base_url=live_web.url + "/v1", api_key=other, max_retries=0, timeout=20).chat.completions.create(
        model="chat.echo@1", messages=[{"role": "user", "content": "x"}]
    )

    expected = {
        "rag.embedding@1:requests": 1,
        "rag.embedding@1:prompt_tokens": 3,
        "chat.echo@1:requests": 3,
        "chat.echo@1:prompt_tokens": 3 + 2 + 4,
        "chat.echo@1:completion_tokens": 4 + 3 + 5,
        "chat.echo@1:ttft_count": 2,
    }
    # Flushed within about a second, by each web process on its own.
    assert wait_until(lambda: all(counted(ids[key])[k] == v for k, v in expected.items()), 10), counted(
        ids[key]
    )
    assert counted(ids[key])["chat.echo@1:errors"] == 0
    # The other credential's call may be flushed a second later, by the same or another web process.
    assert wait_until(lambda: counted(ids[other])["chat.echo@1:requests"] == 1, 10), counted(ids[other])

    # Rolled up once the minute is complete (the sampling task's step, run as if two minutes later);
    # running it again changes nothing.
    later = time.time() + 120
    assert roll_up_usage(later)
    assert roll_up_usage(later) == 0
    mine = UsageSample.objects.filter(credential=ids[key])
    assert sum(r.prompt_tokens for r in mine) == 3 + 3 + 2 + 4
    assert {r.backend for r in mine} == {"echo-u"}

    answer = operator_client.get("/api/v1/usage?days=1&granularity=day&group_by=credential,capability")
    assert answer.status_code == 200, answer.content
    rows = {(r["credential"], r["capability"]): r for r in answer.json()["rows"]}
    chat_row = rows[(ids[key], "chat.echo@1")]
    assert (chat_row["requests"], chat_row["prompt_tokens"], chat_row["completion_tokens"]) == (3, 9, 12)
    assert chat_row["credential_name"] and chat_row["ttft_ms_avg"] is not None
    assert rows[(ids[other], "chat.echo@1")]["requests"] == 1
    # (Filtered to this test's credential: a call of an earlier test may land in these minutes.)
    exported = operator_client.get(
        f"/api/v1/usage?days=1&group_by=capability&credential={ids[key]}&format=csv"
    )
    assert exported.status_code == 200 and exported["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(exported.content.decode())))
    assert {r["capability"]: int(r["requests"]) for r in table} == {"chat.echo@1": 3, "rag.embedding@1": 1}
    refused = operator_client.get("/api/v1/usage?group_by=colour")
    assert refused.status_code == 400 and refused.json()["code"] == "VALIDATION_ERROR"

    # Prometheus: counters and histograms per capability and backend, totalled across processes.
    scraped = operator_client.get("/metrics").content.decode()
    assert 'modelforge_gateway_requests_total{backend="echo-u",capability="chat.echo@1"}' in scraped
    assert 'modelforge_gateway_ttft_seconds_count{backend="echo-u",capability="chat.echo@1"}' in scraped
    assert (
        'modelforge_gateway_latency_seconds_bucket{backend="echo-u",capability="rag.embedding@1",le="+Inf"}'
        in scraped
    )

    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/observability/usage/?window=1").content.decode()
    assert 'id="usage-totals"' in page and "chat.echo@1" in page and "rag.embedding@1" in page


def test_a_stream_that_arrives_whole_with_its_head_is_passed_as_any_stream(live_web, echo):
    # A short answer, or an engine answering from a cache, writes the whole stream at once: the gateway
    # then has all of it with the head. It is still a stream: no usage chunk for a client that did not
    # ask, the model named by the capability, its usage and time to first token counted.
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-u", echo))
    key = credential(["chat.echo@1"])
    key_id = str(ClientCredential.objects.get(display_prefix=key[:12]).pk)
    sdk = OpenAI(base_url=live_web.url + "/v1", api_key=key, max_retries=0, timeout=20)
    plain = list(
        sdk.chat.completions.create(
            model="chat.echo@1", stream=True, messages=[{"role": "user", "content": "__burst__ a b"}]
        )
    )
    assert plain and all(c.choices for c in plain) and all(c.usage is None for c in plain)
    assert {c.model for c in plain} == {"chat.echo@1"}
    assert "".join(c.choices[0].delta.content or "" for c in plain) == "echo: __burst__ a b"
    asked = list(
        sdk.chat.completions.create(
            model="chat.echo@1",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "__burst__ a b"}],
        )
    )
    assert asked[-1].choices == [] and asked[-1].usage is not None
    assert (asked[-1].usage.prompt_tokens, asked[-1].usage.completion_tokens) == (3, 4)
    expected = {
        "chat.echo@1:requests": 2,
        "chat.echo@1:prompt_tokens": 6,
        "chat.echo@1:completion_tokens": 8,
        "chat.echo@1:ttft_count": 2,
    }
    assert wait_until(lambda: all(counted(key_id)[k] == v for k, v in expected.items()), 10), counted(key_id)


# What a client may say of usage, through the `openai` package: every combination of `stream` and
# `stream_options` (left out, `{}`, asking for usage, asking for none).
LEFT_OUT: Any = object()
SDK_CASES = [
    (stream, options)
    for stream in (LEFT_OUT, False, True)
    for options in (LEFT_OUT, {}, {"include_usage": True}, {"include_usage": False})
]
# And as raw bodies, what the `openai` package does not send: `null`s, the key spelt with an escape, the key
# twice (JSON parsers keep the last), and an option of an engine's own beside include_usage.
RAW_CASES = {
    "stream_options null": b'"stream":true,"stream_options":null',
    "include_usage null": b'"stream":true,"stream_options":{"include_usage":null}',
    "escaped key": b'"stream":true,"stream\\u005foptions":{}',
    "asked, then not": b'"stream":true,"stream_options":{"include_usage":true},"stream_options":{}',
    "another option": b'"stream":true,"stream_options":{"include_usage":false,"engine_option":1}',
    "not a stream": b'"stream":false,"stream_options":{}',
}


def _sdk_call(url: str, key: str, stream: Any, options: Any) -> tuple[int, str, bool]:
    """(status, refusal code, whether the client received usage) of one chat call of "a b c" (7 tokens)."""
    extra: dict[str, Any] = {}
    if stream is not LEFT_OUT:
        extra["stream"] = stream
    if options is not LEFT_OUT:
        extra["stream_options"] = options
    sdk = OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)
    try:
        answer: Any = sdk.chat.completions.create(
            model="chat.echo@1", messages=[{"role": "user", "content": "a b c"}], **extra
        )
    except APIStatusError as exc:
        return exc.status_code, exc.body.get("code", "") if isinstance(exc.body, dict) else "", False
    if stream is True:
        chunks = list(answer)
        return 200, "", any(c.usage is not None for c in chunks)
    return 200, "", answer.usage is not None


def _raw_call(url: str, key: str, fields: bytes) -> tuple[int, str, bool]:
    body = b'{"model":"chat.echo@1","messages":[{"role":"user","content":"a b c"}],' + fields + b"}"
    answer = httpx.post(
        url + "/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=20,
    )
    if answer.status_code != 200:
        return answer.status_code, answer.json()["code"], False
    if not answer.headers["content-type"].startswith("text/event-stream"):
        return 200, "", "usage" in answer.json()
    chunks = [
        json.loads(line[5:])
        for line in answer.text.splitlines()
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]
    return 200, "", any(chunk.get("usage") for chunk in chunks)


def test_a_token_budget_holds_whatever_the_client_says_of_usage(live_web, echo, operator_client):
    # Regression (issue 47): a stream with `"stream_options": {}` or `{"include_usage": false}` was never
    # counted (the gateway asked for usage only when stream_options was left out), so a budget of 50
    # tokens a day let any number of such calls through. Each case, on a credential of its own with a
    # budget of 12 tokens a day, is refused at its third call (7 + 7 tokens counted), and a client gets
    # a usage chunk in a stream only when it asked for one.
    bind("chat.echo@1", server=running_server(loopback_node(), "echo-u", echo))
    cases: dict[str, tuple[Any, ...]] = {
        f"sdk stream={'-' if s is LEFT_OUT else s} stream_options={'-' if o is LEFT_OUT else o}": (s, o)
        for s, o in SDK_CASES
    }
    cases |= {f"raw {name}": (fields,) for name, fields in RAW_CASES.items()}
    keys = {name: credential(["chat.echo@1"]) for name in cases}
    for key in keys.values():
        limited(key, operator_client, tokens_per_day=12)
    ids = {name: str(ClientCredential.objects.get(display_prefix=key[:12]).pk) for name, key in keys.items()}

    def run(name: str) -> tuple[list[tuple[int, str]], int, bool]:
        case, key, answers, saw_usage = cases[name], keys[name], [], False
        for counted_by_then in (7, 14, None):
            status, code, usage = (
                _sdk_call(live_web.url, key, *case) if len(case) == 2 else _raw_call(live_web.url, key, *case)
            )
            answers.append((status, code))
            saw_usage = saw_usage or usage
            if counted_by_then is not None:  # the engine's count reaches Redis within about a second
                wait_until(lambda: current_use(ids[name])["tokens_today"] >= counted_by_then, 10)  # noqa: B023
        return answers, int(current_use(ids[name])["tokens_today"]), saw_usage

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = dict(zip(cases, pool.map(run, cases), strict=True))

    def gets_usage(name: str) -> bool:
        """A plain answer always carries its usage; a stream only when the client asked (no raw one
        does: in the body twice, the last value, `{}`, is the one that counts)."""
        if name == "raw not a stream":
            return True
        if name.startswith("raw "):
            return False
        stream, options = cases[name]
        return stream is not True or options == {"include_usage": True}

    refused_third = [(200, ""), (200, ""), (429, "BUDGET_EXHAUSTED")]
    assert results == {name: (refused_third, 14, gets_usage(name)) for name in cases}


def limited(key: str, operator_client, **limits: int | None) -> None:
    pk = ClientCredential.objects.get(display_prefix=key[:12]).pk
    body = dict.fromkeys(
        ("requests_per_minute", "tokens_per_minute", "max_concurrent", "tokens_per_day", "tokens_per_month")
    )
    answer = operator_client.post(f"/api/v1/client-credentials/{pk}/limits", body | limits, format="json")
    assert answer.status_code == 200, answer.content


def test_usage_waits_in_the_process_while_redis_is_away_and_is_flushed_after():
    state = SharedState()
    # Both clients the flush may use (the lean one for a plain redis:// URL) point at nothing.
    state._client = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=0.2)
    state._lean = LeanRedis(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    state.usage.record("7", "", "chat.echo@1", "echo-a", 200, (5, 6), 0.01, 0.02)

    run_in_own_loop(state.flush)  # (a browser test may keep a loop running in this thread)
    assert state.redis_ok is False
    assert state.outbox.pending()[f"7{SEP}{SEP}chat.echo@1{SEP}echo-a{SEP}prompt_tokens"] == 5
    clear_usage()
    state._client = redis.asyncio.Redis.from_url(settings.CELERY_BROKER_URL)
    state._lean = None  # made again from the settings at the next flush
    run_in_own_loop(state.flush)  # (a browser test may keep a loop running in this thread)
    assert not state.usage.counts and not state.usage.totals and not state.outbox.batches
    assert counted("7")["chat.echo@1:prompt_tokens"] == 5


def test_a_batch_of_usage_sent_again_is_counted_once():
    # Regression (issue 47's drill): a flush whose reply did not come (Redis frozen) kept its usage and
    # sent it again, and the frozen Redis ran the first send too when it resumed: tokens counted several
    # times over (16 calls' worth for 6 calls after a few seconds' freeze).
    clear_usage()
    clear_limit_counts()
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    outbox, now = Outbox(), time.time()
    field = f"8{SEP}{SEP}chat.echo@1{SEP}echo-a{SEP}"
    outbox.add(Counter({field + "prompt_tokens": 5, field + "completion_tokens": 6}), Counter())
    for _ in range(3):  # sent, unanswered, sent again: Redis runs every copy
        with client.pipeline(transaction=False) as pipe:
            outbox.write(pipe, int(now // 60), now)
            pipe.execute()
    outbox.add(Counter({field + "prompt_tokens": 1}), Counter())  # a batch after it: counted
    with client.pipeline(transaction=False) as pipe:
        outbox.write(pipe, int(now // 60), now)
        pipe.execute()
    outbox.sent()
    assert counted("8")["chat.echo@1:prompt_tokens"] == 6
    assert current_use("8")["tokens_today"] == 12


def test_a_stream_asks_for_usage_and_keeps_the_client_s_other_choices():
    def asked(body: bytes) -> dict[str, Any] | None:
        shape = checked("/v1/chat/completions", body)
        assert isinstance(shape, ChatCompletion)
        answer = asking_for_usage(body, shape.stream_options)
        return None if answer is None else json.loads(answer)

    chat = b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true'
    # Left out: one insertion, the client's bytes otherwise as sent.
    assert asking_for_usage(chat + b"}", UNSET) == (
        b'{"stream_options":{"include_usage":true},"model":"m","messages":[{"role":"user","content":"x"}],'
        b'"stream":true}'
    )
    assert asked(chat + b',"stream_options":{"include_usage":true}}') is None  # the client asked
    for options in (b"null", b"{}", b'{"include_usage":false}', b'{"include_usage":null}'):
        assert asked(chat + b',"stream_options":' + options + b"}") == {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    kept = asked(chat + b',"stream_options":{"include_usage":false,"continuous_usage_stats":true},"top_k":5}')
    assert kept is not None
    assert kept["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert kept["top_k"] == 5
    # The key spelt with an escape, or sent twice: one key, the value JSON parsers take (the last).
    escaped = asked(chat + b',"stream\\u005foptions":{"x":1}}')
    assert escaped is not None and escaped["stream_options"] == {"x": 1, "include_usage": True}
    twice = asked(chat + b',"stream_options":{"include_usage":true},"stream_options":{"y":2}}')
    assert twice is not None and twice["stream_options"] == {"y": 2, "include_usage": True}


def test_an_answer_s_usage_is_read_from_its_object_only():
    assert usage_in(b'{"model":"m","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}') == (
        3,
        4,
    )
    details = b'{"usage": {"prompt_tokens": 2, "completion_tokens": 1, "prompt_tokens_details": {"x": 1}}}'
    assert usage_in(details) == (2, 1)
    assert usage_in(b'{"usage": null, "choices": []}') is None
    assert usage_in(b'{"content": "no usage here"}') is None
    assert usage_in(b'{"usage": {"prompt_tokens": -1}}') is None


def test_the_meter_counts_each_field_only_for_what_happened_and_adds_up_across_credentials():
    from apps.gateway.usage import Meter

    meter = Meter()
    meter.record("c1", "p", "chat@1", "a", 200, (3, 4), 0.02, 0.3)  # a metered stream
    meter.record("c1", "p", "chat@1", "a", 200, None, None, 0.0004)  # unmetered, not streamed
    meter.record("c2", "", "chat@1", "a", 429, None, None, 0.001, limited=True)  # refused by its limits
    meter.record("c2", "", "chat@1", "a", 200, (0, 0), None, 0.07)  # metered at zero tokens: still metered
    meter.queue_refused("chat@1", "QUEUE_FULL")
    one, two = f"c1{SEP}p{SEP}chat@1{SEP}a{SEP}", f"c2{SEP}{SEP}chat@1{SEP}a{SEP}"
    assert dict(meter.counts) == {
        one + "requests": 2,
        one + "unmetered": 1,
        one + "prompt_tokens": 3,
        one + "completion_tokens": 4,
        one + "ttft_ms": 20,
        one + "ttft_count": 1,
        one + "latency_ms": 300,  # 300 + round(0.4)
        two + "requests": 2,
        two + "errors": 1,
        two + "prompt_tokens": 0,
        two + "completion_tokens": 0,
        two + "latency_ms": 71,
    }
    total = f"chat@1{SEP}a{SEP}"
    assert dict(meter.totals) == {
        total + "requests": 4,
        total + "errors": 1,
        total + "limited": 1,
        total + "prompt_tokens": 3,
        total + "completion_tokens": 4,
        total + "ttft_sum_us": 20_000,
        total + "ttft_le_0.025": 1,
        total + "latency_sum_us": 300_000 + 400 + 1_000 + 70_000,
        total + "latency_le_0.005": 2,
        total + "latency_le_0.1": 1,
        total + "latency_le_0.5": 1,
        f"chat@1{SEP}QUEUE_FULL{SEP}queue_refusals": 1,
    }
    meter.record("c1", "p", "chat@1", "a", 200, (1, 1), None, 0.001)  # after a read: added to the same
    counts, totals = meter.take()
    assert counts[one + "requests"] == 3 and totals[total + "requests"] == 5
    assert not meter.counts and not meter.totals
