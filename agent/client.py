"""The agent's outbound calls to the control plane: enrollment and heartbeats, over httpx.

Seeds: "A failed publication names the status, method and path — never the response body and never
the credential." So a failure is reduced here, at the edge, to exactly those three facts (plus, for an
error code this agent itself knows, that constant): nothing from a response body or from the request's
headers can reach a log or an exception message through this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from agent import __version__

ENROLL_PATH = "/api/v1/agent/enroll"
HEARTBEAT_PATH = "/api/v1/agent/heartbeat"

ENROLLMENT_TOKEN_UNKNOWN = "ENROLLMENT_TOKEN_UNKNOWN"
ENROLLMENT_TOKEN_EXPIRED = "ENROLLMENT_TOKEN_EXPIRED"
ENROLLMENT_TOKEN_USED = "ENROLLMENT_TOKEN_USED"
NODE_CREDENTIAL_INVALID = "NODE_CREDENTIAL_INVALID"
ENROLLMENT_TOKEN_REVOKED = "ENROLLMENT_TOKEN_REVOKED"
NODE_NAME_TAKEN = "NODE_NAME_TAKEN"
# Only these codes are ever taken from a response body: they are ours, so echoing them leaks nothing.
KNOWN_CODES = frozenset(
    {
        ENROLLMENT_TOKEN_UNKNOWN,
        ENROLLMENT_TOKEN_EXPIRED,
        ENROLLMENT_TOKEN_USED,
        ENROLLMENT_TOKEN_REVOKED,
        NODE_NAME_TAKEN,
        NODE_CREDENTIAL_INVALID,
    }
)

DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class ControlPlaneError(Exception):
    """A call to the control plane that did not succeed."""

    method: str
    path: str

    @property
    def retryable(self) -> bool:
        return True


class ControlPlaneUnreachable(ControlPlaneError):
    """No HTTP answer at all: connection refused, DNS, TLS, timeout."""

    def __init__(self, method: str, path: str, reason: str) -> None:
        super().__init__(f"no response ({reason}) {method} {path}")
        self.method = method
        self.path = path
        self.reason = reason


class ControlPlaneRefused(ControlPlaneError):
    """An HTTP answer that is not the success the contract promises. Carries no body."""

    def __init__(self, status: int, method: str, path: str, code: str | None = None) -> None:
        super().__init__(f"{status} {method} {path}")
        self.status = status
        self.method = method
        self.path = path
        self.code = code

    @property
    def retryable(self) -> bool:
        # 5xx and 429 are the control plane's trouble and pass; any other 4xx will not change by itself.
        return self.status >= 500 or self.status == 429


@dataclass(frozen=True)
class Enrollment:
    """What a successful enrollment returns."""

    node_id: str
    node_name: str
    credential: str
    heartbeat_interval_s: int

    def __repr__(self) -> str:
        return f"Enrollment(node_id={self.node_id!r}, node_name={self.node_name!r})"


class ControlPlaneClient:
    """One pooled HTTP client for the control plane at ``base_url`` (which may carry a path prefix)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.base_path = urlsplit(self.base_url).path
        self._http = httpx.Client(
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
            headers={"User-Agent": f"modelforge-agent/{__version__}"},
        )

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        method, full_path = "POST", self.base_path + path
        try:
            response = self._http.post(self.base_url + path, json=payload, headers=headers)
        except httpx.HTTPError as exc:
            # The exception text can quote the URL; its class says what happened without it.
            raise ControlPlaneUnreachable(method, full_path, exc.__class__.__name__) from None
        if not response.is_success:
            raise ControlPlaneRefused(response.status_code, method, full_path, _known_code(response))
        try:
            return response.json()
        except ValueError:
            raise ControlPlaneRefused(response.status_code, method, full_path) from None

    def enroll(self, payload: dict[str, Any]) -> Enrollment:
        """Trade the enrollment token in ``payload`` for a node identity (201)."""
        answer = self._post(ENROLL_PATH, payload)
        try:
            enrollment = Enrollment(
                node_id=_required_text(answer["node_id"]),
                node_name=_required_text(answer["node_name"]),
                credential=_required_text(answer["credential"]),
                heartbeat_interval_s=int(answer["heartbeat_interval_s"]),
            )
        except (KeyError, TypeError, ValueError):
            raise ControlPlaneRefused(201, "POST", self.base_path + ENROLL_PATH) from None
        return enrollment

    def heartbeat(self, credential: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Publish one heartbeat; the control plane's answer (node_id, liveness, enabled, interval)."""
        answer = self._post(HEARTBEAT_PATH, payload, headers={"Authorization": f"Bearer {credential}"})
        if not isinstance(answer, dict):
            raise ControlPlaneRefused(200, "POST", self.base_path + HEARTBEAT_PATH)
        return answer


def _required_text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


def _known_code(response: httpx.Response) -> str | None:
    try:
        code = response.json().get("code")
    except (ValueError, AttributeError):
        return None
    return code if code in KNOWN_CODES else None
