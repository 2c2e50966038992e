"""Operator authentication for ``/api/v1/``: the operator API key, or a staff user's session."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request


class OperatorPrincipal:
    """Who is calling when the operator API key authenticated the request (not a database user)."""

    is_authenticated = True
    is_active = True
    is_staff = True
    is_anonymous = False
    username = "operator-api-key"
    pk = None

    def __str__(self) -> str:
        return self.username


class OperatorKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <MODELFORGE_OPERATOR_API_KEY>``, compared in constant time."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        presented = presented.strip()
        if not presented:
            raise exceptions.AuthenticationFailed("The Bearer token is empty.")
        expected = settings.OPERATOR_API_KEY
        if not expected:
            raise exceptions.AuthenticationFailed(
                "No operator API key is configured (MODELFORGE_OPERATOR_API_KEY); log in instead."
            )
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            raise exceptions.AuthenticationFailed("The operator API key is not valid.")
        return OperatorPrincipal(), None

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="modelforge-operator"'


class StaffSessionAuthentication(authentication.SessionAuthentication):
    """A logged-in Django session (CSRF enforced, as DRF's SessionAuthentication does)."""


class IsOperator(permissions.BasePermission):
    """The operator key, or a session of an active staff user."""

    message = "Operator access is required: a staff user's session or the operator API key."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.is_staff and user.is_active)
