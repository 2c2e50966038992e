"""Agents authenticate with the node credential they received at enrollment."""

from __future__ import annotations

import hmac
from typing import Any

from rest_framework import authentication, permissions
from rest_framework.request import Request

from apps.nodes import codes
from apps.nodes.models import Node, digest
from modelforge.errors import ApiError


def _refused(message: str) -> ApiError:
    return ApiError(
        codes.NODE_CREDENTIAL_INVALID, message, 401, {"WWW-Authenticate": 'Bearer realm="modelforge-agent"'}
    )


class NodeCredentialAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <node credential>``; the request's user is the Node."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise _refused("A node credential is required: Authorization: Bearer <credential>.")
        presented_hash = digest(presented.strip())
        node = (
            Node.objects.filter(credential_hash=presented_hash).only("id", "name", "credential_hash").first()
        )
        # The lookup is by digest of a long random secret; compare anyway, in constant time.
        if node is None or not hmac.compare_digest(node.credential_hash, presented_hash):
            raise _refused("This node credential is not valid; re-enroll the agent with a new token.")
        return AgentPrincipal(node), None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="modelforge-agent"'


class AgentPrincipal:
    """The enrolled node an agent request speaks for."""

    is_authenticated = True
    is_staff = False
    is_active = True

    def __init__(self, node: Node) -> None:
        self.node = node


class IsAgent(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, AgentPrincipal)
