"""Operator authentication for ``/api/v1/``: the operator API key, or a staff user's session."""

from __future__ import annotations

import hmac
from typing import Any, NoReturn

from django.conf import settings
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from modelforge import auththrottle


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
    """``Authorization: Bearer <MODELFORGE_OPERATOR_API_KEY>``, compared in constant time.

    An address with too many failures is refused (``429 TOO_MANY_AUTH_FAILURES``) before the key is
    compared, so a right guess from it is refused like a wrong one (modelforge.auththrottle)."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        source = auththrottle.source_of(request)
        auththrottle.refuse_if_blocked(auththrottle.OPERATOR_API, source)
        presented = presented.strip()
        if not presented:
            self._refuse(source, "The Bearer token is empty.")
        expected = settings.OPERATOR_API_KEY
        if not expected:
            self._refuse(
                source, "No operator API key is configured (MODELFORGE_OPERATOR_API_KEY); log in instead."
            )
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            self._refuse(source, "The operator API key is not valid.")
        return OperatorPrincipal(), None

    @staticmethod
    def _refuse(source: str, message: str) -> NoReturn:
        auththrottle.count_failure(auththrottle.OPERATOR_API, source)
        raise exceptions.AuthenticationFailed(message)

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="modelforge-operator"'


class StaffSessionAuthentication(authentication.SessionAuthentication):
    """A logged-in Django session (CSRF enforced, as DRF's SessionAuthentication does); refused like the
    key from an address with too many failed authentications."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        result = super().authenticate(request)
        if result is not None:
            auththrottle.refuse_if_blocked(auththrottle.OPERATOR_API, auththrottle.source_of(request))
        return result


class IsOperator(permissions.BasePermission):
    """The operator key, or a session of an active staff user."""

    message = "Operator access is required: a staff user's session or the operator API key."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.is_staff and user.is_active)
