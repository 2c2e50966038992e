"""The heartbeat: inventory and telemetry published to the control plane, from which liveness derives.

A failure is logged with status, method and path only and retried with full-jitter exponential
back-off (base: the interval), so a fleet that lost its control plane does not return to it in
lock-step. Heartbeats back off to at most three intervals (30 s by default, under the control plane's
35 s stale limit): a control plane that comes back hears every node again within its grace period, so a
node is never taken offline only because it was still waiting out its back-off. Enrollment backs off to
5 minutes. The first success after start, and the first after a run of failures, is logged
at INFO; the control plane's ``heartbeat_interval_s`` is honoured from then on.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Collection
from typing import Any

from agent import __version__
from agent.accelerator import NVIDIA_TELEMETRY_UNAVAILABLE, Accelerator, GpuTelemetryError
from agent.client import NODE_CREDENTIAL_INVALID, ControlPlaneClient, ControlPlaneRefused
from agent.client import ControlPlaneUnreachable as Unreachable
from agent.models import models_present
from agent.settings import MAX_HEARTBEAT_INTERVAL_S, MIN_HEARTBEAT_INTERVAL_S, AgentSettings
from agent.telemetry import read_host

logger = logging.getLogger("agent.heartbeat")

BACKOFF_CAP_S = 300.0
# Heartbeats back off to at most this many intervals (see the module's docstring).
HEARTBEAT_BACKOFF_INTERVALS = 3
# Full jitter can draw ~0; a floor keeps a broken control plane from being hammered.
MIN_RETRY_DELAY_S = 1.0


def backoff_delay(
    base_s: float, failures: int, rng: Callable[[], float] = random.random, cap_s: float | None = None
) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**failures)], floored at ``MIN_RETRY_DELAY_S``."""
    ceiling = min(BACKOFF_CAP_S if cap_s is None else cap_s, base_s * 2 ** min(failures, 16))
    return max(MIN_RETRY_DELAY_S, rng() * ceiling)


def heartbeat_payload(
    settings: AgentSettings,
    accelerator: Accelerator,
    managed_pids: Collection[int],
    servers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One heartbeat body as the wire contract spells it. May raise ``GpuTelemetryError``.

    ``servers``: per-server entries (``agent.engine_signals``); sent only when there are any, so a node
    whose engines report nothing sends the body it always did."""
    gpus = accelerator.gpus(managed_pids)
    host = read_host()
    payload: dict[str, Any] = {
        "agent_version": __version__,
        "accelerator": accelerator.kind,
        "agent_url": settings.agent_url,
        "cpu": {"count": host.cpu_count, "load_1m": host.load_1m},
        "memory": {"total_bytes": host.memory_total_bytes, "available_bytes": host.memory_available_bytes},
        "shm": {"total_bytes": host.shm_total_bytes, "free_bytes": host.shm_free_bytes},
        "gpus": [gpu.as_payload() for gpu in gpus],
        "models_present": [
            {"name": model.model, "kind": model.kind} for model in models_present(settings.models_dir)
        ],
    }
    if servers:
        payload["servers"] = servers
    return payload


class HeartbeatLoop:
    """Publishes heartbeats until ``stop`` is set."""

    def __init__(
        self,
        client: ControlPlaneClient,
        credential: str,
        build_payload: Callable[[], dict[str, Any]],
        interval_s: float,
        stop: threading.Event,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.client = client
        self._credential = credential
        self.build_payload = build_payload
        self.interval_s = interval_s
        self.stop = stop
        self.rng = rng
        self.failures = 0
        self.accepted = 0
        self.enabled: bool | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            delay = self.beat()
            self.stop.wait(delay)

    def beat(self) -> float:
        """Publish one heartbeat; the delay before the next."""
        try:
            payload = self.build_payload()
        except GpuTelemetryError as exc:
            # A GPU that stopped answering is not reported as if it had: no heartbeat, so the node goes
            # stale and admission stops trusting it, which is what a missing reading should do.
            logger.error(
                "[%s] heartbeat not published: GPU %s did not answer %s (%s)",
                NVIDIA_TELEMETRY_UNAVAILABLE,
                exc.index,
                exc.query,
                exc.error,
            )
            return self._failed()
        except Exception as exc:
            # Whatever broke reading the machine must not end the loop; the next attempt may succeed.
            logger.error(
                "heartbeat not published: reading telemetry failed (%s: %s)", type(exc).__name__, exc
            )
            return self._failed()
        try:
            answer = self.client.heartbeat(self._credential, payload)
        except Unreachable as exc:
            logger.warning(
                "heartbeat publication failed: no response (%s) %s %s", exc.reason, exc.method, exc.path
            )
            return self._failed()
        except ControlPlaneRefused as exc:
            logger.warning("heartbeat publication failed: %s %s %s", exc.status, exc.method, exc.path)
            if exc.code == NODE_CREDENTIAL_INVALID and self.failures == 0:
                logger.error(
                    "[%s] the control plane refused this node's credential (the node removed, or its "
                    "credential revoked?); retrying with back-off until an operator resolves it",
                    NODE_CREDENTIAL_INVALID,
                )
            return self._failed()
        return self._succeeded(answer)

    def _failed(self) -> float:
        self.failures += 1
        cap = min(BACKOFF_CAP_S, HEARTBEAT_BACKOFF_INTERVALS * self.interval_s)
        return backoff_delay(self.interval_s, self.failures, self.rng, cap_s=cap)

    def _succeeded(self, answer: dict[str, Any]) -> float:
        interval = answer.get("heartbeat_interval_s")
        if isinstance(interval, int) and not isinstance(interval, bool):
            self.interval_s = min(max(interval, MIN_HEARTBEAT_INTERVAL_S), MAX_HEARTBEAT_INTERVAL_S)
        if self.accepted == 0:
            logger.info(
                "first heartbeat accepted: node %s is %s (enabled: %s); next every %s s",
                answer.get("node_id"),
                answer.get("liveness"),
                answer.get("enabled"),
                self.interval_s,
            )
        elif self.failures:
            logger.info("heartbeat accepted again after %d failed attempt(s)", self.failures)
        enabled = answer.get("enabled")
        if isinstance(enabled, bool) and self.enabled is not None and enabled != self.enabled:
            logger.info("the control plane %s this node", "enabled" if enabled else "disabled")
        if isinstance(enabled, bool):
            self.enabled = enabled
        self.accepted += 1
        self.failures = 0
        return float(self.interval_s)
