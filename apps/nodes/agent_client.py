"""The control plane's calls to agents: signed with the cluster secret, run from Celery tasks.

A call the agent rejects for a secret mismatch is recorded against the node, by name, visibly: a
node event, ``Node.secret_mismatch_at`` (node page and API) and a ``cluster_secret_mismatch`` alert.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from agent.protocol import sign
from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.nodes import codes
from apps.nodes.choices import EventKind
from apps.nodes.models import Node, NodeEvent
from modelforge.errors import ApiError
from modelforge.logging import current_correlation_id

logger = logging.getLogger(__name__)


@dataclass
class AgentReply:
    status: int
    body: dict[str, Any]


def call_agent(node: Node, method: str, path: str, payload: dict[str, Any] | None = None) -> AgentReply:
    """Make one signed call to ``node``'s agent; record secret mismatches and reachability on the node.

    Raises ``ApiError`` with ``CLUSTER_SECRET_MISMATCH`` or ``AGENT_UNREACHABLE``.
    """
    if not node.agent_url:
        raise ApiError(codes.AGENT_UNREACHABLE, f"Node {node.name} has not reported an agent URL yet.", 503)
    if not settings.CLUSTER_SECRET:
        raise ApiError(
            codes.CLUSTER_SECRET_MISMATCH,
            "MODELFORGE_CLUSTER_SECRET is not set; the control plane cannot sign calls to agents.",
            503,
        )
    body = json.dumps(payload).encode() if payload is not None else b""
    timestamp = int(time.time())
    headers = {
        "X-ModelForge-Timestamp": str(timestamp),
        "X-ModelForge-Signature": sign(settings.CLUSTER_SECRET, timestamp, method, path, body),
        "Content-Type": "application/json",
    }
    correlation_id = current_correlation_id()
    if correlation_id != "-":
        headers["X-Correlation-ID"] = correlation_id
    try:
        response = httpx.request(
            method,
            node.agent_url.rstrip("/") + path,
            content=body,
            headers=headers,
            timeout=settings.AGENT_CALL_TIMEOUT,
        )
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL: a host that is not a valid IDNA name
        _record_unreachable(node, f"{type(exc).__name__} calling {method} {path}")
        raise ApiError(
            codes.AGENT_UNREACHABLE,
            f"The agent of node {node.name} did not answer {method} {path} ({type(exc).__name__}); is it "
            "running, and is its port reachable from the control plane?",
            503,
        ) from exc
    try:
        reply = response.json()
    except ValueError:
        reply = {}
    if response.status_code == 401 and reply.get("code") in {"CLUSTER_SECRET_MISMATCH", "SIGNATURE_EXPIRED"}:
        record_secret_mismatch(node, f"{method} {path} rejected: {reply.get('code')}")
        raise ApiError(
            codes.CLUSTER_SECRET_MISMATCH,
            f"Node {node.name} rejected the control plane's signature ({reply.get('code')}): the cluster "
            "secret differs between MODELFORGE_CLUSTER_SECRET and the agent's "
            "MODELFORGE_AGENT_CLUSTER_SECRET (or the clocks differ by more than 5 minutes).",
            502,
        )
    record_secret_ok(node)
    return AgentReply(response.status_code, reply if isinstance(reply, dict) else {})


def record_secret_mismatch(node: Node, detail: str) -> None:
    now = timezone.now()
    first = Node.objects.filter(pk=node.pk, secret_mismatch_at__isnull=True).update(secret_mismatch_at=now)
    Node.objects.filter(pk=node.pk).update(agent_reached_at=now, agent_error=detail[:255])
    if first:
        NodeEvent.objects.create(node=node, kind=EventKind.SECRET_MISMATCH, at=now, detail=detail)
    Alert.objects.raise_alert(
        codes.ALERT_CLUSTER_SECRET_MISMATCH,
        Severity.CRITICAL,
        "node",
        str(node.pk),
        node.name,
        f"Node {node.name} rejects the control plane's calls: cluster secret mismatch. Give the agent the "
        "same MODELFORGE_AGENT_CLUSTER_SECRET as the control plane's MODELFORGE_CLUSTER_SECRET.",
        at=now,
    )
    logger.warning("node %s rejected a signed call: %s", node.name, detail)


def record_secret_ok(node: Node) -> None:
    now = timezone.now()
    was_mismatched = Node.objects.filter(pk=node.pk, secret_mismatch_at__isnull=False).update(
        secret_mismatch_at=None
    )
    Node.objects.filter(pk=node.pk).update(agent_reached_at=now, agent_error="")
    if was_mismatched:
        NodeEvent.objects.create(node=node, kind=EventKind.SECRET_OK, at=now)
        Alert.objects.clear_for([codes.ALERT_CLUSTER_SECRET_MISMATCH], "node", str(node.pk), at=now)


def _record_unreachable(node: Node, detail: str) -> None:
    # The event marks the moment it became unreachable, not every failed call after it.
    first = Node.objects.filter(pk=node.pk, agent_error="").update(agent_error=detail[:255])
    Node.objects.filter(pk=node.pk).update(agent_error=detail[:255])
    if first:
        NodeEvent.objects.create(node=node, kind=EventKind.AGENT_UNREACHABLE, detail=detail[:500])
    logger.warning("node %s: agent unreachable: %s", node.name, detail)


def ping(node: Node) -> AgentReply:
    return call_agent(node, "GET", "/v1/ping")


def model_presence(node: Node, model: str) -> AgentReply:
    """Ask the node whether ``model`` is on its disk (weights directory, .gguf file, or a directory
    holding one). Later issues call this before every remote launch."""
    return call_agent(node, "POST", "/v1/presence", {"model": model})
