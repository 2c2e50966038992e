"""Prefix affinity and least outstanding work over real HTTP (issue 20): real gunicorn web processes (the
session's and a second one), real echo engines, the test PostgreSQL and Redis.

- A prefix lands on the same backend through either gateway process, and prefixes spread over backends.
- A backend benched mid-run (the sin-bin, or a killed engine found down by the probes) passes its
  prefixes to the next backend on the ring, the others stay where they are, and its prefixes come back
  when it does.
- Mixed candidates (two clusters in a tier, or a cluster and a server) fall back to weighted round robin.
- Bounded loads: concurrent requests for one prefix overflow to the next backend on the ring once the
  home's in-flight would pass the cap, none above it.
- least_outstanding: a backend holding a long request gets none of the next ones, in either process.

The echo engine streams a word every 0.2 s: a stream of n words is in flight for about 0.2 x n s."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from fractions import Fraction

import httpx
import pytest
import redis
from django.conf import settings
from django.db import transaction

from apps.clusters.bindings import Backend
from apps.clusters.tests.factories import (
    bind,
    cluster_with,
    credential,
    echo_backend,
    loopback_node,
    running_server,
)
from apps.gateway.affinity import Ring, conversation_prefix, prefix_hash
from apps.gateway.lbstate import BENCH_KEY, FAILS_KEY, INFLIGHT_KEY, TOKENS_FIELD
from apps.gateway.probe import read_verdicts, summary
from apps.gateway.shapes import checked
from apps.servers.models import ModelServer
from tests.fixtures import PYTHON, LiveWeb, RunningProcess, http_ok, start_process, start_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

MODEL = "tenant.chat@1"
PREFIX_CHARS = 1024  # MODELFORGE_GATEWAY_PREFIX_CHARS's default: what decides a request's backend
# The second gateway process benches for this long (x the times benched): long enough to look at the
# moved prefixes through both processes on a busy two-core machine (24 requests and the waits between
# the processes' turns took 6 s there), short
# enough to see them come back.
B_BENCH_S = 12


def long_text(tag: str, chars: int = 1500) -> str:
    """A tenant's long system prompt: ``tag`` first, so prompts differ from their first characters."""
    words, size, n = [tag], len(tag), 0
    while size < chars:
        word = f"{tag}-rule-{n}"
        words.append(word)
        size += len(word) + 1
        n += 1
    return " ".join(words)


SYSTEMS = [long_text(f"Tenant {i:02d}. You answer for shop {i * 7919 % 1000}.") for i in range(16)]


def chat_body(system: str, user: str, *, stream: bool = False, max_tokens: int | None = None) -> dict:
    body: dict = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    if stream:
        body["stream"] = True
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def post(
    url: str, key: str, path: str, body: dict, session: str | None = None, timeout: float = 20
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["X-ModelForge-Session"] = session
    return httpx.post(url + path, json=body, headers=headers, timeout=timeout)


def served_by(url: str, key: str, path: str, body: dict, session: str | None = None) -> str:
    answer = post(url, key, path, body, session)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-modelforge-backend"]


def chat(url: str, key: str, system: str, user: str = "hello", session: str | None = None) -> str:
    return served_by(url, key, "/v1/chat/completions", chat_body(system, user), session)


def embed(url: str, key: str, text: str) -> str:
    return served_by(url, key, "/v1/embeddings", {"model": MODEL, "input": text})


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def ring_walk(servers: dict[str, ModelServer], path: str, body: dict) -> list[str]:
    """The backends' names clockwise from ``body``'s prefix on the ring every gateway process builds."""
    backends = [Backend(str(s.pk), name, "", 1) for name, s in servers.items()]
    point = prefix_hash(conversation_prefix(checked(path, json.dumps(body).encode()), PREFIX_CHARS))
    return [b.name for b in Ring(backends).walk(point)]


def ready(url: str, key: str) -> None:
    """``url``'s gateway routes ``MODEL`` (the table has it once the change notice arrived)."""

    def answers() -> bool:
        return post(url, key, "/v1/chat/completions", chat_body("ready?", "x")).status_code == 200

    assert wait_until(answers, 15)


def stop(process: RunningProcess) -> None:
    if process.process.poll() is None:
        os.killpg(process.process.pid, signal.SIGCONT)
        os.killpg(process.process.pid, signal.SIGTERM)
        process.process.wait(10)


@pytest.fixture(scope="module")
def gateway_b(live_web, tmp_path_factory) -> Iterator[LiveWeb]:
    """A second gateway process beside the session's (``live_web``, which benches for 2 s x n)."""
    web = start_web(
        tmp_path_factory.mktemp("gateway-b") / "web.log", MODELFORGE_LB_BASE_BENCH_S=str(B_BENCH_S)
    )
    yield web
    web.process.stop()


class Pool:
    """Real echo engines as running servers, and what a test made of them."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.node = loopback_node()
        self.processes: dict[str, RunningProcess] = {}
        self.ports: dict[str, int] = {}
        self.servers: dict[str, ModelServer] = {}

    def engines(self, *names: str) -> list[ModelServer]:
        for name in names:
            process, port = echo_backend(self.tmp_path, name)
            self.processes[name], self.ports[name] = process, port
            self.servers[name] = running_server(self.node, name, port)
        return [self.servers[name] for name in names]

    def cluster(self, algorithm: str, *names: str, weights: dict[str, int] | None = None) -> str:
        """A cluster "pool" of the named engines bound to ``MODEL``; a credential's key for it."""
        servers = self.engines(*names)
        with transaction.atomic():  # one routing change: no table ever has part of it
            bind(
                MODEL,
                cluster=cluster_with(
                    "pool", [(s, (weights or {}).get(s.name, 1)) for s in servers], algorithm=algorithm
                ),
            )
        return credential([MODEL])

    def kill(self, name: str) -> None:
        stop(self.processes[name])

    def restart(self, name: str) -> None:
        port = self.ports[name]
        self.processes[name] = start_process(
            [PYTHON, "-m", "agent.engines.echo", "--port", str(port), "--model", name],
            {},
            self.tmp_path / f"{name}-again.log",
        )
        assert wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 20)

    def settled(self, processes: int) -> None:
        """Every engine answers the probes of ``processes`` gateway processes: none is unknown to one of
        them (a request would pass an unknown backend over, as a benched one, until its first probe)."""

        def up_everywhere() -> bool:
            verdicts = read_verdicts() or {}
            return all(
                sum(1 for v in verdicts.get(str(s.pk), []) if v.get("up")) >= processes
                for s in self.servers.values()
            )

        assert wait_until(up_everywhere, 15)

    def quiet(self) -> None:
        """No gateway process has a request to these engines in flight as of its last flush, and every
        process has read that (its next flush). Sequential traffic through two processes otherwise meets
        the other's in-flight count as of its last flush: a request that was in flight at that flush
        counts for up to two seconds after it ended, and one request in flight is enough to pass a
        backend's cap at this load (ceil(1.25 x 2 / 3) = 1), as the bounded-loads test across processes
        shows."""
        keys = {str(s.pk) for s in self.servers.values()}
        keys |= {TOKENS_FIELD + k for k in keys}
        store = redis.Redis.from_url(settings.CELERY_BROKER_URL, decode_responses=True)

        def clean() -> bool:
            for name in store.scan_iter(INFLIGHT_KEY.format(process="*")):
                if keys & set(store.hkeys(name)):
                    return False
            return True

        assert wait_until(clean, 10, interval=0.1)
        time.sleep(1.2)

    def ring(self) -> dict[str, ModelServer]:
        """The cluster's servers by backend name ("pool/<member>")."""
        return {f"pool/{name}": server for name, server in self.servers.items()}

    def close(self) -> None:
        for process in self.processes.values():
            stop(process)


@pytest.fixture
def pool(tmp_path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(BENCH_KEY)
    yield made
    made.close()


def test_a_prefix_lands_on_the_same_backend_through_either_gateway_process(live_web, gateway_b, pool):
    key = pool.cluster("prefix_affinity", "a", "b", "c")
    urls = [live_web.url, gateway_b.url]
    for url in urls:
        ready(url, key)
    pool.settled(len(urls))
    # 16 tenants' long system prompts, each 4 times with another user turn, alternately through A and B
    # (a round each; the tails and the sessions below ride along).
    shared = SYSTEMS[0][:PREFIX_CHARS]
    seen: dict[int, list[str]] = defaultdict(list)
    tails: set[str] = set()
    sessions: dict[str, set[str]] = defaultdict(set)
    for turn, url in enumerate(urls * 2):
        if turn:
            pool.quiet()
        for i, system in enumerate(SYSTEMS):
            seen[i].append(chat(url, key, system, f"question {turn} from tenant {i}"))
        # Prompts that share the first 1,024 characters and differ after them.
        tails |= {chat(url, key, shared + f" and then variant {turn}.{n}", f"q{n}") for n in range(2)}
        # Sessions (the header) over conversations that change every turn.
        for n in range(12):
            system = SYSTEMS[(n + turn * 5) % len(SYSTEMS)]
            sessions[f"session-{n}"].add(chat(url, key, system, f"turn {turn}", f"session-{n}"))
    assert not {i: b for i, b in seen.items() if len(set(b)) > 1}
    homes = {i: backends[0] for i, backends in seen.items()}
    spread = Counter(homes.values())
    assert len(spread) > 1, spread
    # Each is its prefix's home on the ring both processes build from the same backends.
    ring = pool.ring()
    for i, system in enumerate(SYSTEMS):
        body = chat_body(system, "x")
        assert homes[i] == ring_walk(ring, "/v1/chat/completions", body)[0], i
    # The first 1,024 characters decide: prompts that share them land together.
    assert tails == {homes[0]}
    # A session header decides over the conversation: one backend per session, whatever is sent.
    assert not {n: b for n, b in sessions.items() if len(b) > 1}
    assert len({next(iter(b)) for b in sessions.values()}) > 1, dict(sessions)
    print(f"affinity: 16 prompts x 4 through two processes, homes {dict(spread)}")


def through_each(pool: Pool, urls: list[str], key: str, send, texts: list[str]) -> dict[int, str]:
    """Each text's backend (``send(url, key, text)``), through every process in turn (asserting they
    agree)."""
    per_process = []
    for url in urls:
        pool.quiet()
        per_process.append({i: send(url, key, text) for i, text in enumerate(texts)})
    assert all(found == per_process[0] for found in per_process), per_process
    return per_process[0]


def test_a_backend_benched_mid_run_passes_its_prefixes_to_the_next_on_the_ring_and_takes_them_back(
    live_web, gateway_b, pool
):
    """The sin-bin: a backend answering 5xx (its probe still answers) is benched by one process, its
    prefixes move to the next backend on the ring in both, and return when the bench is over."""
    key = pool.cluster("prefix_affinity", "a", "b", "c")
    urls = [live_web.url, gateway_b.url]
    for url in urls:
        ready(url, key)
    pool.settled(len(urls))
    inputs = [long_text(f"Document {i:02d} of the corpus.", 1200) for i in range(12)]
    ring = pool.ring()
    walks = {
        i: ring_walk(ring, "/v1/embeddings", {"model": MODEL, "input": text}) for i, text in enumerate(inputs)
    }
    homes = {i: walk[0] for i, walk in walks.items()}
    assert {i: embed(live_web.url, key, text) for i, text in enumerate(inputs)} == homes
    victim = Counter(homes.values()).most_common(1)[0][0]
    moved = [i for i, home in homes.items() if home == victim]
    server = pool.ring()[victim]
    store = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    store.delete(FAILS_KEY.format(key=server.pk))
    # Failures of the victim alone: its own prefix with the engine's failure trigger past the 1,024
    # characters that decide, through the second process until it benches it.
    failing = inputs[moved[0]] + " __status_500__"
    pool.quiet()
    for _ in range(settings.LB_CONSECUTIVE_FAILURES + 3):
        answer = post(gateway_b.url, key, "/v1/embeddings", {"model": MODEL, "input": failing})
        assert answer.status_code == 502 and victim in answer.json()["message"], answer.text
        if store.hexists(BENCH_KEY, str(server.pk)):
            break
    raw = store.hget(BENCH_KEY, str(server.pk))
    assert raw is not None, "never benched"
    until = json.loads(raw)["until"]
    # Both processes (the session's reads the bench list at its next flush, within quiet()'s wait).
    during = through_each(pool, urls, key, embed, inputs)
    assert time.time() < until, "too slow: the bench was over before every prefix was sent"
    for i, backend in during.items():
        if i in moved:  # to the next backend on its ring, the same through both processes
            assert backend == walks[i][1] != victim, (i, backend)
        else:  # the others' prefixes stay where they were
            assert backend == homes[i], (i, homes[i], backend)
    # The bench over (its probe answered all along): its prefixes come back to it, in both processes.
    for url in (gateway_b.url, live_web.url):
        pool.quiet()
        assert wait_until(lambda: all(embed(url, key, inputs[i]) == victim for i in moved), 30)  # noqa: B023
    assert {i: embed(live_web.url, key, text) for i, text in enumerate(inputs)} == homes
    print(f"bench: {len(moved)} of {len(inputs)} prefixes moved off {victim} and back")


def probe_state(server: ModelServer) -> str:
    return str(summary((read_verdicts() or {}).get(str(server.pk)))["state"])


def test_a_killed_backend_passes_its_prefixes_on_with_no_client_error_and_takes_them_back(
    live_web, gateway_b, pool
):
    """The probes: an engine stopped mid-run is out (its connections refused, retried on the next backend
    on the ring, then down by probe), and back on its port its prefixes return."""
    key = pool.cluster("prefix_affinity", "a", "b", "c")
    urls = [live_web.url, gateway_b.url]
    for url in urls:
        ready(url, key)
    pool.settled(len(urls))
    ring = pool.ring()
    walks = {i: ring_walk(ring, "/v1/chat/completions", chat_body(s, "x")) for i, s in enumerate(SYSTEMS)}
    home = {i: walk[0] for i, walk in walks.items()}  # where they are (the first test: through both)
    assert {i: chat(live_web.url, key, s) for i, s in enumerate(SYSTEMS)} == home
    victim = Counter(home.values()).most_common(1)[0][0]
    name = victim.split("/", 1)[1]
    moved = [i for i, h in home.items() if h == victim]
    pool.kill(name)
    during: dict[int, set[str]] = defaultdict(set)
    for n, url in enumerate(urls):  # at once: refused connections, each retried once elsewhere (no error)
        if n:
            pool.quiet()
        for i, system in enumerate(SYSTEMS):
            during[i].add(chat(url, key, system))
    assert wait_until(lambda: probe_state(pool.servers[name]) == "down", 15)
    for i, backend in through_each(pool, urls, key, chat, SYSTEMS).items():  # down by probe in both processes
        during[i].add(backend)
    for i, backends in during.items():
        if i in moved:
            assert backends == {walks[i][1]}, (i, walks[i][1], backends)
        else:
            assert backends == {home[i]}, (i, home[i], backends)
    pool.restart(name)
    for url in urls:
        pool.quiet()
        assert wait_until(lambda: all(chat(url, key, SYSTEMS[i]) == victim for i in moved), 20)  # noqa: B023
    assert {i: chat(gateway_b.url, key, s) for i, s in enumerate(SYSTEMS)} == home


@pytest.mark.parametrize("mix", ["two clusters", "a cluster and a server"])
def test_mixed_candidates_fall_back_to_weighted_round_robin(live_web, pool, mix):
    """A tier of two clusters (one of them prefix_affinity), or of a cluster and a standalone server: the
    same prefix goes round the backends in their weights' proportion (1:1:2)."""
    a, b, c = pool.engines("a", "b", "c")
    with transaction.atomic():  # one routing change: no table ever has one binding without the other
        bind(MODEL, cluster=cluster_with("sticky", [(a, 1), (b, 1)], algorithm="prefix_affinity"))
        if mix == "two clusters":
            bind(MODEL, cluster=cluster_with("plain", [(c, 2)]))
        else:
            bind(MODEL, server=c, weight=2)
    key = credential([MODEL])
    ready(live_web.url, key)
    pool.settled(1)
    seen = Counter(chat(live_web.url, key, SYSTEMS[0], f"q{n}") for n in range(40))
    third = "plain/c" if mix == "two clusters" else "c"
    # Smooth weighted round robin: the weights' shares within a request or two (the readiness check's
    # picks came before these 40).
    expected = {"sticky/a": 10, "sticky/b": 10, third: 20}
    assert set(seen) == set(expected), seen
    assert all(abs(seen[name] - count) <= 2 for name, count in expected.items()), seen


class Stream(threading.Thread):
    """One streamed chat request; ``head`` is set once its answer's head (the backend) has arrived."""

    def __init__(self, url: str, key: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.body = url, key, body
        self.head = threading.Event()
        self.status, self.backend, self.error = 0, "", ""

    def run(self) -> None:
        try:
            with (
                httpx.Client(timeout=30) as client,
                client.stream(
                    "POST",
                    self.url + "/v1/chat/completions",
                    json=self.body,
                    headers={"Authorization": f"Bearer {self.key}"},
                ) as answer,
            ):
                self.status = answer.status_code
                self.backend = answer.headers.get("x-modelforge-backend", "")
                self.head.set()
                for _ in answer.iter_bytes():
                    pass
        except Exception as exc:  # said by the test, which waits for the head
            self.error = repr(exc)
        finally:
            self.head.set()


def started(url: str, key: str, body: dict) -> Stream:
    stream = Stream(url, key, body)
    stream.start()
    assert stream.head.wait(10) and stream.status == 200, (stream.status, stream.error)
    return stream


def bounded(order: list[str], count: int, pct: int = 125) -> list[str]:
    """Where ``count`` requests for one prefix go, each sent while the ones before are in flight, on
    backends of weight 1 in ring ``order``: the first whose load would stay within
    ceil(pct % x (in flight + 1) x weight / total weight)."""
    load = dict.fromkeys(order, 0)
    sent = []
    for in_flight in range(count):
        cap = math.ceil(Fraction(pct, 100) * (in_flight + 1) / len(order))
        backend = next(b for b in order if load[b] + 1 <= cap)
        load[backend] += 1
        sent.append(backend)
    return sent


def test_concurrent_requests_for_one_prefix_overflow_to_the_next_backend_past_the_cap(live_web, pool):
    key = pool.cluster("prefix_affinity", "a", "b", "c")
    ready(live_web.url, key)
    pool.settled(1)
    system = SYSTEMS[3]
    ring = ring_walk(pool.ring(), "/v1/chat/completions", chat_body(system, "x"))
    assert chat(live_web.url, key, system) == ring[0]
    # 9 streams of 30 words (6 s each), each started once the one before has its backend: all in flight.
    streams = [started(live_web.url, key, chat_body(system, words(30), stream=True)) for _ in range(9)]
    sent = [s.backend for s in streams]
    for stream in streams:
        stream.join(20)
    # Home 1; over its cap (1 of 2 in flight) the next; ... the third backend only when both are full.
    assert sent == bounded(ring, 9), (sent, ring)
    assert sent == [ring[i] for i in (0, 1, 0, 1, 0, 1, 2, 0, 1)]
    assert max(Counter(sent).values()) <= math.ceil(1.25 * 9 / 3)
    # Nothing in flight any more: home again.
    assert chat(live_web.url, key, system) == ring[0]
    print(f"bounded loads: 9 concurrent requests for one prefix went {Counter(sent)}")


def test_bounded_loads_count_the_other_processes_requests(live_web, gateway_b, pool):
    """One request in flight through A on a backend is counted by B (as of A's last flush): at this load
    it is the backend's whole cap (ceil(1.25 x (1 + 1) / 3) = 1), so B sends another prefix homed there
    to the next backend on the ring, and a prefix homed elsewhere stays home."""
    key = pool.cluster("prefix_affinity", "a", "b", "c")
    urls = [live_web.url, gateway_b.url]
    for url in urls:
        ready(url, key)
    pool.settled(len(urls))
    ring = pool.ring()
    walks = [ring_walk(ring, "/v1/chat/completions", chat_body(system, "x")) for system in SYSTEMS]
    first = walks[0][0]
    second = next(i for i in range(1, len(SYSTEMS)) if walks[i][0] == first)
    elsewhere = next(i for i in range(1, len(SYSTEMS)) if walks[i][0] != first)
    pool.quiet()
    held = started(live_web.url, key, chat_body(SYSTEMS[0], words(30), stream=True))
    assert held.backend == first
    store = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    theirs = INFLIGHT_KEY.format(process="*")
    server = str(ring[first].pk)

    def published() -> bool:
        return any(store.hget(name, server) for name in store.scan_iter(theirs))

    assert wait_until(published, 5, interval=0.1)
    time.sleep(1.2)  # the second process's next flush reads it
    assert chat(gateway_b.url, key, SYSTEMS[second]) == walks[second][1]
    assert chat(gateway_b.url, key, SYSTEMS[elsewhere]) == walks[elsewhere][0]
    assert chat(live_web.url, key, SYSTEMS[second]) == walks[second][1]  # A's own count: the same
    assert held.is_alive(), "the held request ended before the test was done with it"
    held.join(20)
    pool.quiet()
    assert chat(gateway_b.url, key, SYSTEMS[second]) == first


def test_least_outstanding_sends_the_next_requests_away_from_a_backend_holding_a_long_one(
    live_web, gateway_b, pool
):
    key = pool.cluster("least_outstanding", "p", "q")
    for url in (live_web.url, gateway_b.url):
        ready(url, key)
    pool.settled(2)
    # A long slow request (a 4,000-character prompt, max_tokens 2,000, 80 words streamed: 16 s).
    long_one = started(
        live_web.url, key, chat_body(long_text("Contract", 4000), words(80), stream=True, max_tokens=2000)
    )
    busy = long_one.backend
    other = ({"pool/p", "pool/q"} - {busy}).pop()
    short = chat_body("Be brief.", "hi", max_tokens=16)
    assert [served_by(live_web.url, key, "/v1/chat/completions", short) for _ in range(5)] == [other] * 5
    # The second process has the first one's counts after a flush of each (once a second; later on a
    # loaded machine): from then on it sends the short requests away from the long one too.
    assert wait_until(lambda: served_by(gateway_b.url, key, "/v1/chat/completions", short) == other, 10)
    assert [served_by(gateway_b.url, key, "/v1/chat/completions", short) for _ in range(5)] == [other] * 5
    # Work, not connections: two small slow requests on the other backend are less than the long one.
    smalls = [
        started(live_web.url, key, chat_body("Be brief.", words(20), stream=True, max_tokens=1))
        for _ in range(2)
    ]
    assert [s.backend for s in smalls] == [other, other]
    assert served_by(live_web.url, key, "/v1/chat/completions", short) == other
    assert long_one.is_alive(), "the long request ended before the test was done with it"
    for stream in (long_one, *smalls):
        stream.join(30)
