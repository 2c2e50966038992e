"""What the gateway knows of its backends' engines: the signals their nodes report with heartbeats.

The gateway never asks an engine itself (N gateways x M backends scrapes would be the cost); the agents
read their own engines and the heartbeat endpoint keeps the latest in Redis (apps/nodes/engine_signals.py,
hash ``ENGINE_SIGNALS_KEY``: server id -> JSON). A gateway process reads the whole hash in its
once-a-second flush, with ``read_engine_signals`` (redis-py) or ``aread_engine_signals`` (redis.asyncio),
or queues the HGETALL on a pipeline it already sends (``queue_read`` + ``decode_read``), and keeps the
signals that are ``fresh_signals``: reported within ``MODELFORGE_ENGINE_SIGNALS_MAX_AGE_S`` and by the
node the backend runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apps.nodes.engine_signals import (
    ENGINE_SIGNALS_KEY,
    EngineSignals,
    aread_engine_signals,
    decode_signals,
    max_age_s,
    read_engine_signals,
)

__all__ = [
    "ENGINE_SIGNALS_KEY",
    "EngineSignals",
    "aread_engine_signals",
    "decode_read",
    "fresh_signals",
    "max_age_s",
    "queue_read",
    "read_engine_signals",
]


def queue_read(pipe: Any) -> None:
    """Queue the read on a pipeline (sync or async) the caller executes with its own commands; pass that
    command's result to ``decode_read``."""
    pipe.hgetall(ENGINE_SIGNALS_KEY)


def decode_read(raw: Mapping[Any, Any], now: float) -> dict[str, EngineSignals]:
    """The pipeline's HGETALL result as signals by server id (unreadable or long-forgotten fields are
    skipped here; ``read_engine_signals`` also deletes them)."""
    return decode_signals(raw, now)[0]


def fresh_signals(
    signals: Mapping[str, EngineSignals],
    now: float,
    max_age: float | None = None,
    nodes: Mapping[str, str] | None = None,
) -> dict[str, EngineSignals]:
    """The signals fit to act on: reported within ``max_age`` (default: the setting) of ``now`` and, when
    ``nodes`` (server id -> node id) is given, by the node that server runs on (a server moved, or a
    node reporting for a server it does not run, is not believed)."""
    limit = max_age_s() if max_age is None else max_age
    return {
        server: s
        for server, s in signals.items()
        if s.fresh(now, limit) and (nodes is None or nodes.get(server) == s.node_id)
    }
