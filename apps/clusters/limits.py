"""Where a client credential's limits are counted in Redis: the keys the gateway's admission script
and flush write (apps/gateway/limits.py), and what the credential's page and API read back from them."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import redis

IN_FLIGHT_TTL_S = 600  # a call's slot is forgotten after this long if its process died holding it
KEY = "modelforge:limit:{credential}:{what}"


def keys(credential: str, now: float) -> list[str]:
    moment = datetime.fromtimestamp(now, tz=UTC)
    return [
        KEY.format(credential=credential, what="requests"),
        KEY.format(credential=credential, what="in-flight"),
        KEY.format(credential=credential, what=f"tpm:{int(now // 60)}"),
        KEY.format(credential=credential, what=f"day:{moment:%Y%m%d}"),
        KEY.format(credential=credential, what=f"month:{moment:%Y%m}"),
    ]


def current_use(credential: str) -> dict[str, int | bool]:
    """What ``credential`` uses now as its limits count it; zeros and ``limits_enforced: false`` while
    Redis cannot be read."""
    from django.conf import settings

    now = time.time()
    requests, in_flight, minute, day, month = keys(credential, now)
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=0.3, socket_timeout=0.5)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.zcount(requests, int((now - 60) * 1000), "+inf")
        pipe.zcount(in_flight, int((now - IN_FLIGHT_TTL_S) * 1000), "+inf")
        pipe.mget(minute, day, month)
        recent, flying, tokens = pipe.execute()
    except (redis.RedisError, OSError):
        return dict.fromkeys(
            ("requests_last_minute", "in_flight", "tokens_this_minute", "tokens_today", "tokens_this_month"),
            0,
        ) | {"limits_enforced": False}
    minute_t, day_t, month_t = (int(t or 0) for t in tokens)
    return {
        "requests_last_minute": int(recent),
        "in_flight": int(flying),
        "tokens_this_minute": minute_t,
        "tokens_today": day_t,
        "tokens_this_month": month_t,
        "limits_enforced": True,
    }
