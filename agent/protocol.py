"""Signing of control plane → agent calls with the cluster secret: the one definition both sides share.

The control plane imports ``sign`` (or ``signed_headers``) from here to sign the calls it makes to an
agent's port; the agent calls ``verify`` on every request it receives. Pure functions of their
arguments (``now`` is a parameter), so either side can test them without a clock or a network.

The signed message is ``f"{timestamp}\\n{METHOD}\\n{path}\\n".encode() + body`` where ``path`` is the
request target exactly as sent on the request line (with its query string, if any) and ``body`` the
raw request body bytes. The signature is the lower-case hex HMAC-SHA256 of that message keyed with the
cluster secret (UTF-8).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

TIMESTAMP_HEADER = "X-ModelForge-Timestamp"
SIGNATURE_HEADER = "X-ModelForge-Signature"
CORRELATION_HEADER = "X-Correlation-ID"

# A signed request older (or newer) than this is refused: it bounds how long a captured request can be
# replayed, and a clock further off than this is itself worth an operator's attention.
MAX_CLOCK_SKEW_S = 300

CLUSTER_SECRET_MISMATCH = "CLUSTER_SECRET_MISMATCH"
SIGNATURE_EXPIRED = "SIGNATURE_EXPIRED"


@dataclass(frozen=True)
class SignatureRefusal:
    """Why a request's signature was not accepted: a code for the envelope and a message for people."""

    code: str
    message: str


def signed_message(timestamp: int, method: str, path: str, body: bytes = b"") -> bytes:
    return f"{timestamp}\n{method.upper()}\n{path}\n".encode() + body


def sign(secret: str, timestamp: int, method: str, path: str, body: bytes = b"") -> str:
    """The hex HMAC-SHA256 signature of one request."""
    return hmac.new(
        secret.encode("utf-8"), signed_message(timestamp, method, path, body), hashlib.sha256
    ).hexdigest()


def signed_headers(
    secret: str, method: str, path: str, body: bytes = b"", *, now: float | None = None
) -> dict[str, str]:
    """The two headers a caller adds to a request to an agent (timestamp: now, in whole seconds)."""
    timestamp = int(time.time() if now is None else now)
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, method, path, body),
    }


def verify(
    secret: str,
    timestamp_header: str | None,
    signature_header: str | None,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    now: float | None = None,
    max_skew_s: int = MAX_CLOCK_SKEW_S,
) -> SignatureRefusal | None:
    """``None`` when the request is authentic and fresh; otherwise the refusal to send back.

    1. Both headers must be present and the timestamp a whole number of seconds.
    2. The signature must match (constant-time comparison), else ``CLUSTER_SECRET_MISMATCH``.
    3. Only then is freshness judged, so ``SIGNATURE_EXPIRED`` always means "right secret, clock off or
       request replayed" — the diagnosis an operator needs — and never leaks anything to a wrong secret.
    """
    if not timestamp_header or not signature_header:
        return SignatureRefusal(
            CLUSTER_SECRET_MISMATCH,
            f"the request is not signed; send {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} "
            "computed with the cluster secret",
        )
    stripped = timestamp_header.strip()
    if not stripped.isdigit():
        return SignatureRefusal(
            CLUSTER_SECRET_MISMATCH, f"{TIMESTAMP_HEADER} must be a whole number of Unix seconds"
        )
    timestamp = int(stripped)
    expected = sign(secret, timestamp, method, path, body)
    # Bytes on both sides: compare_digest refuses non-ASCII str, and a header may carry anything.
    offered = signature_header.strip().lower().encode("utf-8", "replace")
    if not hmac.compare_digest(expected.encode("ascii"), offered):
        return SignatureRefusal(
            CLUSTER_SECRET_MISMATCH,
            "the request signature does not match this agent's cluster secret; make "
            "MODELFORGE_AGENT_CLUSTER_SECRET equal to the control plane's cluster secret",
        )
    current = time.time() if now is None else now
    if abs(current - timestamp) > max_skew_s:
        return SignatureRefusal(
            SIGNATURE_EXPIRED,
            f"the request timestamp is more than {max_skew_s} s from this agent's clock; "
            "check that both machines keep time (NTP)",
        )
    return None
