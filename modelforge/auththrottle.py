"""Repeated API authentication failures from one address: ``429 TOO_MANY_AUTH_FAILURES`` with ``Retry-After``.

The operator API (the operator key; a staff session) and the agent API (enrollment tokens, node
credentials) count failures per source address; the serving gateway does not (its refusals stay ``401
CAPABILITY_NOT_AUTHORIZED`` exactly). The dashboard's and the admin's log-in forms are django-axes'.

1. A presented credential that fails (a wrong operator key, an unknown, revoked or expired enrollment
   token, an invalid node credential) counts against its address in Redis, so every web process counts
   together: one round trip (``SET NX EX`` opens the window, ``INCR``, ``TTL``, in one transaction).
   A request without any credential is not a guess and is not counted; a success is never counted.
2. The failure that reaches ``MODELFORGE_API_AUTH_FAILURE_LIMIT`` blocks the address for a whole
   ``MODELFORGE_API_AUTH_FAILURE_WINDOW`` from that moment; ``Retry-After`` says how long is left.
3. Where a guess could be confirmed by a success (the operator API, enrollment), a blocked address is
   refused before its credential is looked at, the right one too: a block answers the same whatever is
   presented. Node credentials are 256 random bits and nodes behind one NAT address share it, so the
   heartbeat and artifact downloads only count and refuse failures: a valid node is still heard.
4. Redis unreachable: nothing is counted or refused (fail open), said once per outage in the log, and
   Redis is not asked again for a few seconds so that an outage costs no request its timeout. A Redis
   outage must not lock operators out (docs/DECISIONS.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from modelforge.errors import codes

if TYPE_CHECKING:
    from modelforge.errors import ApiError

logger = logging.getLogger("modelforge.auth")

KEY = "modelforge:authfail:{scope}:{source}"  # failures of one address in the window; expires with it

# Counters: the operator's failures and the agents' are counted apart, so that a broken agent on the
# operator's machine does not lock the operator out of the API.
OPERATOR = "operator"
AGENT = "agent"

# After Redis fails, it is left alone for this long: an unreachable (not refusing) Redis would otherwise
# cost every authentication its socket timeout.
RETRY_REDIS_AFTER_S = 5.0
TIMEOUT_S = 0.3


@dataclass(frozen=True)
class Surface:
    """Where credentials are presented: which counter, and what a blocked caller is told."""

    scope: str
    what: str  # the credential, for the message
    # What happens meanwhile to a caller with a good credential from the same address.
    meanwhile: str


OPERATOR_API = Surface(
    OPERATOR,
    "operator API authentications",
    "Every credential from this address is refused until then, the right one too: fix the key "
    "(MODELFORGE_OPERATOR_API_KEY) and wait",
)
ENROLLMENT = Surface(
    AGENT,
    "agent authentications",
    "Enrollment from this address is refused until then, a valid token too: mint a token for this agent "
    "and wait",
)
NODE_CREDENTIAL = Surface(
    AGENT,
    "node credentials",
    "Nodes with a valid credential are still heard; this one is not valid: re-enroll the agent with a new "
    "token",
)


def key(scope: str, source: str) -> str:
    return KEY.format(scope=scope, source=source)


def source_of(request: Any) -> str:
    """The caller's address: its peer, or the client a trusted proxy names (``MODELFORGE_TRUSTED_PROXIES``,
    resolved for every request by modelforge.proxies)."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def scope_source(scope: dict[str, Any]) -> str:
    """The same, for the lean ASGI endpoints."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def refusal(surface: Surface, source: str, retry_after: int) -> ApiError:
    # Imported here: modelforge.errors imports DRF, whose settings import modelforge.auth, which imports us.
    from modelforge.errors import ApiError

    return ApiError(
        codes.TOO_MANY_AUTH_FAILURES,
        f"Too many {surface.what} failed from {source} ({settings.API_AUTH_FAILURE_LIMIT} within "
        f"{settings.API_AUTH_FAILURE_WINDOW} s): retry after {retry_after} s. {surface.meanwhile}.",
        429,
        {"Retry-After": str(retry_after)},
    )


class AuthThrottle:
    """One per process: Redis clients (synchronous for Django's views, asynchronous for the lean
    endpoints) and the fail-open state."""

    def __init__(self) -> None:
        self._url: str | None = None
        self._client: redis.Redis | None = None
        self._async: tuple[asyncio.AbstractEventLoop, aioredis.Redis] | None = None
        self._down_until = 0.0
        self._down = False

    def _current(self) -> str:
        url = str(settings.CELERY_BROKER_URL)
        if url != self._url:  # a new Redis (tests point at their own): new clients, a clean slate
            self._url, self._client, self._async = url, None, None
            self._down_until, self._down = 0.0, False
        return url

    def _sync_client(self) -> redis.Redis:
        url = self._current()
        if self._client is None:
            self._client = redis.Redis.from_url(
                url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S
            )
        return self._client

    def _async_client(self) -> aioredis.Redis:
        url = self._current()
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            self._async = (
                loop,
                aioredis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S),
            )
        return self._async[1]

    def _skipping(self) -> bool:
        self._current()
        return self._down and time.monotonic() < self._down_until

    def _failed(self, exc: Exception) -> None:
        if not self._down:
            logger.warning(
                "Redis unreachable (%s): API authentication failures are not counted and no address is "
                "refused for them until it answers (fail open)",
                type(exc).__name__,
            )
        self._down = True
        self._down_until = time.monotonic() + RETRY_REDIS_AFTER_S

    def _back(self) -> None:
        if self._down:
            logger.warning("Redis reachable again: API authentication failures are counted again")
        self._down = False

    @staticmethod
    def _blocked_for(count: Any, ttl: Any) -> int | None:
        if count is None or int(count) < settings.API_AUTH_FAILURE_LIMIT:
            return None
        ttl = int(ttl)
        return max(ttl, 1) if ttl != -2 else None

    # --- Django's views (synchronous) ---------------------------------------------------------------

    def blocked(self, scope: str, source: str) -> int | None:
        """Seconds until ``source`` may try again, or None when it is not blocked (or Redis is away)."""
        if self._skipping():
            return None
        name = key(scope, source)
        try:
            pipe = self._sync_client().pipeline(transaction=False)
            pipe.get(name)
            pipe.ttl(name)
            count, ttl = pipe.execute()
        except (redis.RedisError, OSError) as exc:
            self._failed(exc)
            return None
        self._back()
        return self._blocked_for(count, ttl)

    def failed(self, scope: str, source: str) -> int | None:
        """Count one failure; seconds of the block when this failure reached the limit or came past it."""
        if self._skipping():
            return None
        name, window = key(scope, source), int(settings.API_AUTH_FAILURE_WINDOW)
        try:
            client = self._sync_client()
            pipe = client.pipeline()
            pipe.set(name, 0, ex=window, nx=True)  # the first failure opens the window
            pipe.incr(name)
            pipe.ttl(name)
            _, count, ttl = pipe.execute()
            if int(count) == settings.API_AUTH_FAILURE_LIMIT:
                client.expire(name, window)  # the block lasts a whole window from the moment it starts
                ttl = window
        except (redis.RedisError, OSError) as exc:
            self._failed(exc)
            return None
        self._back()
        return self._blocked_for(count, ttl)

    # --- the lean ASGI endpoints (asynchronous) ---------------------------------------------------------

    async def afailed(self, scope: str, source: str) -> int | None:
        """``failed`` for the lean endpoints."""
        if self._skipping():
            return None
        name, window = key(scope, source), int(settings.API_AUTH_FAILURE_WINDOW)
        try:
            client = self._async_client()
            apipe = client.pipeline()
            apipe.set(name, 0, ex=window, nx=True)
            apipe.incr(name)
            apipe.ttl(name)
            _, count, ttl = await apipe.execute()
            if int(count) == settings.API_AUTH_FAILURE_LIMIT:
                await client.expire(name, window)
                ttl = window
        except (redis.RedisError, OSError) as exc:
            self._failed(exc)
            return None
        self._back()
        return self._blocked_for(count, ttl)


throttle = AuthThrottle()


def refuse_if_blocked(surface: Surface, source: str) -> None:
    """Raise the 429 when ``source`` is blocked; before any credential is looked at."""
    retry_after = throttle.blocked(surface.scope, source)
    if retry_after is not None:
        raise refusal(surface, source, retry_after)


def count_failure(surface: Surface, source: str) -> None:
    """Count a failed credential; raise the 429 instead of the caller's 401 once the limit is reached."""
    retry_after = throttle.failed(surface.scope, source)
    if retry_after is not None:
        raise refusal(surface, source, retry_after)
