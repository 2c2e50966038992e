"""The serving gateway: OpenAI-compatible ``/v1/*`` as a lean ASGI application beside Django.

``model`` names a capability (``rag.embedding@1``); the credential must be scoped to exactly that. The
request's OpenAI shape is checked before any backend is contacted (apps/gateway/shapes.py).
No database query and no Redis round trip per request (the routing table is cached per process and
refreshed by a thread of its own; the load-balancer counts are flushed by a task of their own), pooled
keep-alive connections to backends, bounded timeouts and request size, streaming passed through chunk
by chunk. Every failure is the envelope; a credential problem is always ``401 CAPABILITY_NOT_AUTHORIZED`` with
the same headers, only the message differs.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import msgspec
from django.conf import settings

from apps.clusters import codes
from apps.clusters.choices import Algorithm
from apps.gateway.admission import QueueRefusal, admission
from apps.gateway.affinity import (
    MAX_SESSION_CHARS,
    SESSION_HEADER,
    Ask,
    conversation_prefix,
    estimated_tokens,
    prefix_hash,
)
from apps.gateway.lbstate import shared
from apps.gateway.limits import LimitReached, limiter
from apps.gateway.routing import (
    NOT_KNOWN,
    Backend,
    Grant,
    Table,
    authorize,
    detached_clusters,
    not_bound_for,
    router,
)
from apps.gateway.shapes import ShapeError, TooDeep, checked
from apps.gateway.upstream import ConnectFailed, Upstream, UpstreamError, UpstreamTimeout
from apps.gateway.usage import asking_for_usage, usage_event, usage_in
from modelforge.errors import codes as error_codes
from modelforge.jsonbounds import TOO_DEEP_MESSAGE, nul_message, scan_json
from modelforge.lean import (
    JSON,
    BodyTooLarge,
    Receive,
    Send,
    correlate,
    internal_error,
    log_access,
    read_bounded_body,
    refuse,
    request_headers,
    respond,
)

logger = logging.getLogger("modelforge.gateway")


PREFIX = "/v1/"
MODELS_PREFIX = "/v1/models/"
FORWARDED = {"/v1/embeddings", "/v1/chat/completions", "/v1/completions"}
UNAUTHORIZED_HEADERS = {"www-authenticate": 'Bearer realm="modelforge-gateway"'}
# Upstream: a connection within 2 s, then every chunk within 120 s (a long generation streams chunks).
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 120.0
# A request that finds no backend rebuilds a routing table older than this before it is refused.
NO_BACKEND_REBUILD_S = 1.0


# Request headers the gateway looks at; the others are never decoded.
_WANTED_HEADERS = frozenset(
    {b"authorization", b"x-correlation-id", b"content-length", SESSION_HEADER.encode()}
)


class Refusal(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class Gateway:
    """The ASGI callable for ``/v1/*``."""

    def __init__(self) -> None:
        self._upstream: Upstream | None = None

    @property
    def upstream(self) -> Upstream:
        """Pooled keep-alive connections to every backend, made in the serving loop on first use.

        A lean HTTP/1.1 client (apps/gateway/upstream.py), not httpx or aiohttp: per proxied request the
        bench measured httpx's async client at ~1.2 ms of CPU, aiohttp's at ~240 µs, this one at ~60 µs."""
        if self._upstream is None:
            self._upstream = Upstream(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        return self._upstream

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = time.monotonic()
        headers = request_headers(scope, _WANTED_HEADERS)
        correlation_id = correlate(headers)
        status = 500
        call = Call(started)
        try:
            status = await self._serve(scope, receive, send, headers, correlation_id, call)
        except (Refusal, QueueRefusal) as exc:
            status = exc.status
            await refuse(send, exc.status, exc.code, exc.message, correlation_id, exc.headers)
        except Exception:
            logger.exception("gateway request failed")
            await internal_error(send, correlation_id)
        if call.slot is not None:  # a concurrency slot: given back once the answer has ended
            limiter.release(call.grant.id, call.slot)  # type: ignore[union-attr]
        if call.grant is not None:  # an authorised call: its usage counts (a few increments, no I/O)
            shared.usage.record(
                call.grant.id,
                call.grant.project,
                call.capability,
                call.backend,
                status,
                call.usage,
                call.first_byte_at - started if call.streamed and call.first_byte_at else None,
                time.monotonic() - started,
                call.limited,
            )
        if status >= 400 or logger.isEnabledFor(logging.DEBUG):
            log_access(logger, logging.INFO, scope["method"], scope["path"], status, started)

    async def _serve(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        correlation_id: str,
        call: Call,
    ) -> int:
        path, method = scope["path"], scope["method"]
        table = router.current() or await router.table()
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        presented = presented.strip() if scheme.lower() == "bearer" else ""
        if path == "/v1/models" or path.startswith(MODELS_PREFIX):
            if method != "GET":
                raise Refusal(405, error_codes.METHOD_NOT_ALLOWED, "Use GET.", {"allow": "GET"})
            # One model: the credential must be scoped to it, refused exactly as a call to it would be
            # (no oracle for which capabilities exist).
            wanted = path[len(MODELS_PREFIX) :] if path != "/v1/models" else None
            grant, why = authorize(table, presented, wanted)
            if grant is None and why == NOT_KNOWN:
                table = await router.caught_up()
                grant, why = authorize(table, presented, wanted)
            if grant is None:
                raise Refusal(401, codes.CAPABILITY_NOT_AUTHORIZED, why, UNAUTHORIZED_HEADERS)
            if wanted is not None:
                # Bound only for other projects: the call would be refused, so the model is too.
                elsewhere = not_bound_for(table, wanted, grant.project)
                if elsewhere is not None:  # a binding made a moment ago: as for a call, look again first
                    table = await router.caught_up(older_than=NO_BACKEND_REBUILD_S)
                    elsewhere = not_bound_for(table, wanted, grant.project)
                if elsewhere is not None:
                    raise Refusal(401, codes.CAPABILITY_NOT_AUTHORIZED, elsewhere, UNAUTHORIZED_HEADERS)
                answer: dict[str, Any] = model_object(table, wanted)
            else:
                callable_ = [
                    n for n in sorted(grant.scopes) if not_bound_for(table, n, grant.project) is None
                ]
                answer = {"object": "list", "data": [model_object(table, n) for n in callable_]}
            await respond(send, 200, json.dumps(answer).encode(), JSON, correlation_id)
            return 200
        if path not in FORWARDED:
            raise Refusal(
                404,
                error_codes.NOT_FOUND,
                f"The gateway serves /v1/models and {', '.join(sorted(FORWARDED))}.",
            )
        if method != "POST":
            raise Refusal(405, error_codes.METHOD_NOT_ALLOWED, "Use POST.", {"allow": "POST"})
        try:
            body = await read_bounded_body(receive, headers)
        except BodyTooLarge as exc:
            # A body it did not drain: the answer closes the connection (else the server would go on
            # reading, and throwing away, whatever length the client declared).
            raise Refusal(
                413, error_codes.PAYLOAD_TOO_LARGE, error_codes.DEFAULT_MESSAGES[413], exc.headers
            ) from None
        # The request's shape, before the credential and before any backend: a body the engine cannot
        # take never reaches it (an engine's 5xx counts towards the sin-bin). See apps/gateway/shapes.py.
        too_deep, nul = scan_json(body)
        if too_deep:
            raise Refusal(400, error_codes.JSON_TOO_DEEP, TOO_DEEP_MESSAGE)
        try:
            shape = checked(path, body)
        except ShapeError as exc:
            raise Refusal(400, error_codes.VALIDATION_ERROR, str(exc)) from None
        except TooDeep:
            raise Refusal(400, error_codes.JSON_TOO_DEEP, TOO_DEEP_MESSAGE) from None
        except msgspec.DecodeError:
            raise Refusal(400, error_codes.MALFORMED_REQUEST, "The body is not valid JSON.") from None
        if nul:
            raise Refusal(400, error_codes.VALIDATION_ERROR, nul_message(body))
        capability = shape.model
        grant, why = authorize(table, presented, capability)
        if grant is None and why == NOT_KNOWN:
            # Minted a moment ago, its change notice still on the way: check the version before refusing.
            table = await router.caught_up()
            grant, why = authorize(table, presented, capability)
        if grant is None:
            raise Refusal(401, codes.CAPABILITY_NOT_AUTHORIZED, why, UNAUTHORIZED_HEADERS)
        call.grant, call.capability = grant, capability
        if grant.limits is not None:  # one Redis round trip, for a credential with limits only
            try:
                call.slot = await limiter.admit(grant.id, grant.limits)
            except LimitReached as exc:
                call.limited = True
                raise Refusal(429, exc.code, exc.message, {"retry-after": str(exc.retry_after_s)}) from None
        if getattr(shape, "stream", None):
            call.streamed = True
            # Tokens are counted from the engine's usage, which a stream reports only when asked: ask,
            # whatever the client said of it (`{}`, `"include_usage": false`), and take the usage chunk
            # out of what a client that did not ask receives. Streams only: an answer carries its usage.
            asking = asking_for_usage(body, shape.stream_options)  # type: ignore[union-attr]
            if asking is not None:
                body, call.strip_usage = asking, True
        backends, algorithm, _cluster = router.candidates_in(table, capability, grant.project)
        if not backends:
            # A server that started running a moment ago, a tier bound a moment ago: as for the credential.
            # And a row changed without a signal (a node enabled again by a queryset update), which moves no
            # version: a table older than a second is rebuilt (at most once a second per process while a
            # capability has no backend).
            table = await router.caught_up(older_than=NO_BACKEND_REBUILD_S)
            backends, algorithm, _cluster = router.candidates_in(table, capability, grant.project)
        if backends and not _serves(backends, path):
            served = sorted({p for b in backends for p in b.endpoints})
            raise Refusal(
                404,
                codes.ENDPOINT_NOT_SERVED,
                f"{capability!r} is served by an engine that does not serve {path}; it serves "
                f"{', '.join(served)}. The runtime profile's `endpoints` says what its engine serves.",
            )
        backends = [b for b in backends if path in b.endpoints]
        tried: set[str] = set()
        if shared.flusher is None:
            shared.start_flushing()  # the counts and the bench list, once a second, beside the requests
            shared.probes.start(router.backends)  # and the backends' probes (apps/gateway/probe.py)
        # Health from the data plane: only backends that answered their probe recently get traffic. One
        # set lookup per candidate; anything else (a newcomer, a backend down) takes the slow path.
        healthy = shared.probes.healthy
        ring_of = backends  # prefix affinity's ring: a backend that is out passes its prefixes on
        for candidate in backends:
            if candidate.key not in healthy:
                backends, algorithm = await answering(
                    table, capability, grant.project, path, backends, algorithm
                )
                if backends[0] not in ring_of:  # the next tier's: its own ring
                    ring_of = backends
                break
        # Benched backends sit out, unless every candidate is benched: then routing goes on to them
        # rather than to none (and the bench is logged and shown), never a total outage in silence.
        if shared.benched:
            benched = {b.key for b in backends if shared.is_benched(b.key)}
            usable = [b for b in backends if b.key not in benched] or backends
        else:
            usable = backends
        # A backend whose runtime profile limits its concurrency: wait for room (apps/gateway/admission.py).
        limited = admission.limited(usable)
        # What the request says of itself, for the algorithms that read it (apps/gateway/affinity.py).
        ask = asked(algorithm, shape, body, headers) if algorithm in BY_REQUEST else None
        if ask is not None:
            call.tokens = ask.tokens
        for _attempt in range(2):  # a request that reached no backend is retried once elsewhere
            if limited:
                backend = await admission.take(
                    usable, algorithm, tried, capability, grant.id, receive, ask, ring_of
                )
            else:
                backend = router.pick(usable, algorithm, tried, ask, ring_of)
            if backend is None:
                break
            tried.add(backend.key)
            call.backend = backend.name
            try:
                status = await self._forward(
                    backend, path, body, send, correlation_id, call, table.spaces.get(capability)
                )
            except ConnectFailed as exc:
                # Nothing reached the backend: count it, and try another once.
                await shared.failed(
                    backend.key, backend.name, f"no connection ({type(exc).__name__})", backends
                )
                logger.warning("backend %s could not be reached; trying another", backend.name)
                continue
            except BackendAnswered as exc:
                if exc.status >= 500:
                    # 503: the backend is full (counted as at capacity for the card), still a failure run.
                    await shared.failed(
                        backend.key,
                        backend.name,
                        f"HTTP {exc.status}",
                        backends,
                        at_capacity=exc.status == 503,
                    )
                    raise Refusal(
                        502,
                        codes.UPSTREAM_FAILED,
                        f"Backend {backend.name} failed (HTTP {exc.status}): {exc.message}",
                    ) from None
                # A 4xx is the backend judging the request, not failing: never towards the sin-bin, and
                # it ends a run of failures (Envoy's consecutive-5xx detection does the same).
                await shared.served(backend.key, at_capacity=exc.status == 429)
                raise Refusal(
                    exc.status,
                    codes.UPSTREAM_REJECTED,
                    f"Backend {backend.name} refused the request: {exc.message}",
                ) from None
            except UpstreamTimeout as exc:
                await shared.failed(backend.key, backend.name, f"timeout ({type(exc).__name__})", backends)
                raise Refusal(
                    504, codes.UPSTREAM_TIMEOUT, f"Backend {backend.name} did not answer in time."
                ) from None
            except UpstreamError as exc:
                await shared.failed(backend.key, backend.name, type(exc).__name__, backends)
                raise Refusal(
                    502, codes.UPSTREAM_FAILED, f"Backend {backend.name} failed ({type(exc).__name__})."
                ) from None
            if status >= 500:
                await shared.failed(backend.key, backend.name, "failed mid-response", backends)
            elif not shared.served_quickly(backend.key):
                await shared.served(backend.key)
            return status
        if not backends:
            elsewhere = not_bound_for(table, capability, grant.project)
            if elsewhere is not None:
                raise Refusal(401, codes.CAPABILITY_NOT_AUTHORIZED, elsewhere, UNAUTHORIZED_HEADERS)
            detached, only = detached_clusters(table, capability, grant.project)
            # "cluster 'pair' (tier 0) has" / "clusters 'a' (tier 0), 'b' (tier 1) have"
            named = (
                f"cluster {detached[0]} has" if len(detached) == 1 else f"clusters {', '.join(detached)} have"
            )
            if only:
                # Its tiers bind only clusters with every server detached (a membership change under way):
                # no node is at fault, and saying so sends the operator to the cluster, not the nodes.
                raise Refusal(
                    503,
                    codes.CLUSTER_DETACHED,
                    f"No running backend serves {capability!r} for this credential: {named} no server "
                    "attached. Attach its members' servers (Clusters, the cluster's Members card).",
                    {"retry-after": "5"},
                )
            also = f" {named[0].upper()}{named[1:]} no server attached." if detached else ""
            raise Refusal(
                503,
                codes.NO_ELIGIBLE_NODE,
                f"No running backend serves {capability!r} for this credential: no enabled node runs one "
                f"(running). See the capability's routing tiers and its servers.{also}",
                {"retry-after": "5"},
            )
        raise Refusal(
            503,
            codes.NO_ELIGIBLE_NODE,
            f"Every backend tried for {capability!r} refused the connection.",
            {"retry-after": "5"},
        )

    async def _forward(
        self,
        backend: Backend,
        path: str,
        body: bytes,
        send: Send,
        correlation_id: str,
        call: Call,
        space: str | None = None,
    ) -> int:
        """Proxy one request. A backend error becomes the envelope (the backend's message kept); a
        success streams through chunk by chunk, never buffered."""
        shared.in_flight[backend.key] += 1
        if call.tokens:
            shared.in_flight_tokens[backend.key] += call.tokens
        started = False
        response = None
        try:
            response = await self.upstream.post(
                backend.url,
                path,
                body,
                [("Content-Type", "application/json"), ("X-Correlation-Id", correlation_id)],
            )
            if response.status >= 400:
                text = (await response.read()).decode(errors="replace")
                raise BackendAnswered(response.status, _backend_message(text))
            named = _NAMED.get(call.capability)
            if named is None:
                if len(_NAMED) > 10_000:  # capabilities come and go
                    _NAMED.clear()
                named = _NAMED[call.capability] = json.dumps(call.capability).encode()
            content_type = response.content_type()
            headers = [
                (b"content-type", content_type),
                (b"x-correlation-id", correlation_id.encode()),
                (b"x-modelforge-backend", backend.name.encode()),
            ]
            if space is not None:  # the embedding space the answer was made in (apps/embedding_migrations)
                headers.append((b"x-modelforge-embedding-space", space.encode()))
            if not response.complete and not content_type.startswith(b"text/event-stream"):
                # A JSON answer longer than its first read: gathered (the client needs all of it anyway)
                # so that its `model` can be named, up to a bound; past it, passed through as it comes.
                await response.gather(RENAME_AT_MOST)
            if response.complete:
                # The whole answer came with its head (the usual case for embeddings and non-streamed
                # chat, and for a short stream): one body message, so the server writes it at once with a
                # Content-Length. A stream is still a stream: renamed and its usage taken event by event.
                if content_type.startswith(b"text/event-stream"):
                    whole = EventRenamer(named, call.strip_usage)
                    body_out = whole.whole(response.take_available())
                    call.usage = whole.usage
                    call.first_byte_at = time.monotonic()
                else:
                    body_out = renamed(response.take_available(), named)
                    call.usage = usage_in(body_out)
                headers.append((b"content-length", str(len(body_out)).encode()))
                await send({"type": "http.response.start", "status": response.status, "headers": headers})
                started = True
                await send({"type": "http.response.body", "body": body_out, "more_body": False})
                return response.status
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            started = True
            events = (
                EventRenamer(named, call.strip_usage)
                if content_type.startswith(b"text/event-stream")
                else None
            )
            async for chunk in response.chunks():
                if events is not None:
                    chunk = events.feed(chunk)
                    if not chunk:
                        continue
                if call.first_byte_at == 0.0:
                    call.first_byte_at = time.monotonic()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if events is not None:
                if rest := events.rest():
                    await send({"type": "http.response.body", "body": rest, "more_body": True})
                call.usage = events.usage
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return response.status
        except UpstreamError as exc:
            if not started:
                raise
            # Mid-stream: the status is sent, so the client sees a cut-off body; say so in the log.
            logger.warning(
                "backend %s failed mid-response (%s); the client got a truncated body",
                backend.name,
                type(exc).__name__,
            )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return 599
        finally:
            if response is not None:
                response.release()
            shared.in_flight[backend.key] -= 1
            if call.tokens:
                shared.in_flight_tokens[backend.key] -= call.tokens
            if admission.waiting:  # its slot, straight to the next waiter
                admission.released(backend.key)


BY_REQUEST = frozenset((Algorithm.LEAST_OUTSTANDING, Algorithm.PREFIX_AFFINITY))


def _serves(backends: list[Backend], path: str) -> bool:
    """Whether one of ``backends`` serves ``path``. A loop: ``any`` over a generator that stops early
    closes it, raising GeneratorExit inside it, on every request."""
    for backend in backends:  # noqa: SIM110
        if path in backend.endpoints:
            return True
    return False


def asked(algorithm: str, shape: Any, body: bytes, headers: dict[str, str]) -> Ask:
    """A request's prefix point (prefix_affinity) and estimated tokens (both algorithms)."""
    tokens = estimated_tokens(body, shape)
    if algorithm != Algorithm.PREFIX_AFFINITY:
        return Ask(tokens=tokens)
    session = headers.get(SESSION_HEADER)
    if session:
        return Ask(prefix_hash("session\x1d" + session[:MAX_SESSION_CHARS]), tokens)
    return Ask(prefix_hash(conversation_prefix(shape, settings.GATEWAY_PREFIX_CHARS)), tokens)


async def answering(
    table: Table, capability: str, project: str, path: str, backends: list[Backend], algorithm: str
) -> tuple[list[Backend], str]:
    """The candidates that answer their probes (the newcomers probed now, bounded by the probe timeout);
    when none of a tier's do, the next tier's (a tier of dead backends is a tier with none running).
    When no tier has one: ``503 NO_HEALTHY_BACKEND`` with Retry-After, at once — never a request sent to
    a backend that does not answer (a frozen one would hold it until the read timeout). Unlike the
    sin-bin, which routes to benched backends rather than to none: a bench is a guess from past errors,
    a failed probe is the backend failing to answer now, and it is back at its first answered probe."""
    up = await shared.probes.usable(backends)
    if up:
        return up, algorithm
    down = list(backends)
    skip = {b.key for b in backends}
    while True:
        tier, tier_algorithm, _cluster = router.next_tier(table, capability, project, frozenset(skip))
        tier = [b for b in tier if b.key not in skip]
        if not tier:
            break
        skip |= {b.key for b in tier}
        serving = [b for b in tier if path in b.endpoints]
        up = await shared.probes.usable(serving) if serving else []
        if up:
            return up, tier_algorithm
        down += serving
    raise Refusal(
        503,
        codes.NO_HEALTHY_BACKEND,
        f"No backend of {capability!r} answers its health probe: {shared.probes.why_not(down)}. The "
        "control plane lists them running; see their servers' logs and nodes.",
        {"retry-after": str(settings.GATEWAY_PROBE_EVERY_S)},
    )


def model_object(table: Table, name: str) -> dict[str, Any]:
    """OpenAI's model object for a capability."""
    return {"id": name, "object": "model", "created": table.created.get(name, 0), "owned_by": "modelforge"}


# `"model": "<anything>"` in JSON: a string's own quotes are escaped inside it, so this matches keys only.
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
# A capability's name as a JSON string, made once per capability (every answer names its model).
_NAMED: dict[str, bytes] = {}
# A non-streamed answer is gathered to name its model up to this size; a larger one passes as it comes.
RENAME_AT_MOST = 16 * 2**20


def renamed(body: bytes, named: bytes) -> bytes:
    """``body`` with every ``"model"`` field naming the capability the client asked for (``named``, JSON):
    the backend's own name for its model (a folder, a file) is the backend's business; the backend is in
    ``x-modelforge-backend``."""
    # Every match starts at a `"model"`: the bytes' own search finds those, and the expression is tried
    # only there, instead of its search walking the whole answer (an embedding's is a kilobyte of numbers
    # after its one "model" key) and an ``in`` first (see modelforge/http_protocol.py's _lean_handler).
    # Left to right, never inside a match: what ``_MODEL_FIELD.sub`` does (the tests compare the two).
    at = body.find(b'"model"')
    if at < 0:
        return body
    parts: list[bytes] = []
    start = 0
    while at >= 0:
        match = _MODEL_FIELD.match(body, at)
        if match is None:
            at = body.find(b'"model"', at + 1)
            continue
        parts += (body[start:at], b'"model":', named)
        start = match.end()
        at = body.find(b'"model"', start)
    if not parts:
        return body
    parts.append(body[start:])
    return b"".join(parts)


class Call:
    """One request's account, for usage: filled in as the request goes."""

    __slots__ = (
        "backend",
        "capability",
        "first_byte_at",
        "grant",
        "limited",
        "slot",
        "started",
        "streamed",
        "strip_usage",
        "tokens",
        "usage",
    )

    def __init__(self, started: float) -> None:
        self.started = started
        self.grant: Grant | None = None
        self.capability = ""
        self.backend = ""  # the backend's name; empty when none was reached
        self.streamed = False
        self.strip_usage = False
        self.usage: tuple[int, int] | None = None
        self.first_byte_at = 0.0
        self.slot: str | None = None  # a concurrency slot to give back
        self.limited = False  # refused by the credential's limits
        self.tokens = 0  # its estimated work, counted in flight (least_outstanding)


class EventRenamer:
    """``renamed`` over a server-sent event stream, a whole line at a time: a line cut between two reads is
    held until its end arrives (a client can use no part of a line before its end anyway). The engine's
    usage is read on the way, and its usage-only chunk dropped when ``strip_usage`` (the client did not
    ask for it)."""

    def __init__(self, named: bytes, strip_usage: bool = False) -> None:
        self.named, self.held, self.strip_usage = named, b"", strip_usage
        self.usage: tuple[int, int] | None = None
        # The backend's own ``"model"`` field as its first event spelled it: an engine names its model the
        # same way in every event, so later lines are renamed by a plain replace (a third of the regular
        # expression's cost per read) when that field accounts for every ``"model"`` key in them.
        self.field: bytes | None = None
        self.replacement = b'"model":' + named

    def feed(self, chunk: bytes) -> bytes:
        data = self.held + chunk if self.held else chunk
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) < RENAME_AT_MOST:
            self.held = data
            return b""
        if end == 0:
            end = len(data)
        self.held = data[end:]
        return self._pass(data[:end])

    def rest(self) -> bytes:
        rest, self.held = self.held, b""
        return self._pass(rest)

    def whole(self, stream: bytes) -> bytes:
        """A whole stream at once (it came with its head): ``feed`` and ``rest`` in one step."""
        return self._pass(stream)

    def _pass(self, lines: bytes) -> bytes:
        # ``find``, not ``in``, on every read: see modelforge/http_protocol.py's _lean_handler.
        if lines.find(b'"usage"') >= 0:
            lines = self._take_usage(lines)
        field = self.field
        if field is None:
            if lines.find(b'"model"') < 0 or (found := _MODEL_FIELD.search(lines)) is None:
                return lines
            field = self.field = found.group(0)
        # Outside a JSON string `"model"` is a key (inside one its quotes are escaped): when every such key
        # is the field already seen, replacing the field renames them all.
        if lines.count(b'"model"') == lines.count(field):
            return lines.replace(field, self.replacement)
        return renamed(lines, self.named)

    def _take_usage(self, lines: bytes) -> bytes:
        kept = []
        for line in lines.splitlines(keepends=True):
            if line.find(b'"usage"') >= 0:
                usage, usage_only = usage_event(line)
                if usage is not None:
                    self.usage = usage
                    if usage_only and self.strip_usage:
                        continue
            kept.append(line)
        return b"".join(kept)


class BackendAnswered(Exception):
    """The backend answered with an error status before anything was sent to the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _backend_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"][:300]
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data["message"][:300]
    return text[:300]


gateway = Gateway()
