"""The error envelope: one exception type, one renderer, one DRF exception handler.

Every error response body is exactly ``{"code", "message", "correlation_id"}``. A 500 is the plain text
``Internal Server Error`` and nothing else: the full story goes to the log under the correlation id.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import ProtectedError
from django.http import HttpResponse, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.views import exception_handler as drf_default_handler

from modelforge.errors import codes
from modelforge.logging import current_correlation_id

logger = logging.getLogger("modelforge.errors")

INTERNAL_SERVER_ERROR_BODY = "Internal Server Error"
# Marks a response as already rendered as the envelope, so the middleware leaves it alone.
ENVELOPE_MARKER = "_modelforge_envelope"


class ApiError(Exception):
    """A refusal with a name: the code, the HTTP status and a message saying what to do."""

    def __init__(self, code: str, message: str, status: int = 400, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.headers = headers or {}


def envelope_body(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message, "correlation_id": current_correlation_id()}


def envelope_response(
    code: str, message: str, status: int, headers: dict[str, str] | None = None
) -> JsonResponse:
    response = JsonResponse(envelope_body(code, message), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    setattr(response, ENVELOPE_MARKER, True)
    return response


def internal_server_error() -> HttpResponse:
    response = HttpResponse(INTERNAL_SERVER_ERROR_BODY, status=500, content_type="text/plain")
    setattr(response, ENVELOPE_MARKER, True)
    return response


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    """DRF's nested validation details as ``field: message`` phrases, in order."""
    if isinstance(detail, dict):
        parts: list[str] = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            parts.extend(_flatten(value, f"{prefix}.{name}" if prefix and name else (name or prefix)))
        return parts
    if isinstance(detail, list):
        parts = []
        for index, value in enumerate(detail):
            nested = isinstance(value, dict | list)
            parts.extend(_flatten(value, f"{prefix}[{index}]" if nested else prefix))
        return parts
    text = str(detail)
    return [f"{prefix}: {text}" if prefix else text]


def describe_validation(detail: Any) -> str:
    """A serializer's errors as one line (``field: message; ...``), as the API's envelope phrases them;
    for dashboard forms that validate through the API's serializers."""
    return "; ".join(_flatten(detail))


_DRF_CODES: list[tuple[type[Exception], str]] = [
    (drf_exceptions.ValidationError, codes.VALIDATION_ERROR),
    (drf_exceptions.ParseError, codes.MALFORMED_REQUEST),
    (drf_exceptions.NotAuthenticated, codes.NOT_AUTHENTICATED),
    (drf_exceptions.AuthenticationFailed, codes.NOT_AUTHENTICATED),
    (drf_exceptions.PermissionDenied, codes.PERMISSION_DENIED),
    (drf_exceptions.NotFound, codes.NOT_FOUND),
    (drf_exceptions.MethodNotAllowed, codes.METHOD_NOT_ALLOWED),
    (drf_exceptions.NotAcceptable, codes.NOT_ACCEPTABLE),
    (drf_exceptions.UnsupportedMediaType, codes.UNSUPPORTED_MEDIA_TYPE),
    (drf_exceptions.Throttled, codes.RATE_LIMITED),
]


# DRF's codes of the refusals that depend on what is stored or on the clock, not on the request's shape
# (codes.NAME_TAKEN and its neighbours), in order of precedence: a body that names a missing row and a
# taken name is answered for the missing row. A ValidationError is answered with one of these only when
# every error in it is of that kind; any other error makes it a VALIDATION_ERROR, as before.
STATE_REFUSALS: list[tuple[str, str, int]] = [
    ("does_not_exist", codes.REFERENCE_NOT_FOUND, 400),
    ("unique", codes.NAME_TAKEN, 409),
    (codes.EXPIRY_IN_PAST, codes.EXPIRY_IN_PAST, 400),
    (codes.CONFLICTS_WITH_STORED, codes.CONFLICTS_WITH_STORED, 409),
]


def _leaf_codes(codes_: Any) -> list[str]:
    if isinstance(codes_, dict):
        return [code for value in codes_.values() for code in _leaf_codes(value)]
    if isinstance(codes_, list):
        return [code for value in codes_ for code in _leaf_codes(value)]
    return [str(codes_)]


def state_refusal(exc: drf_exceptions.ValidationError) -> tuple[str, int] | None:
    """The envelope's code and status for a ValidationError whose every error is a refusal for what is
    stored (STATE_REFUSALS); None for any other."""
    leaves = set(_leaf_codes(exc.get_codes()))
    known = {drf_code for drf_code, _, _ in STATE_REFUSALS}
    if not leaves or not leaves <= known:
        return None
    return next((code, status) for drf_code, code, status in STATE_REFUSALS if drf_code in leaves)


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    """DRF's ``EXCEPTION_HANDLER``: render every API error as the envelope."""
    if isinstance(exc, ApiError):
        return envelope_response(exc.code, exc.message, exc.status, exc.headers)
    if isinstance(exc, ProtectedError):
        # A delete of a row others still hold (a capability behind an alias or a cutover, ...): named.
        holders = sorted({f"{o._meta.verbose_name} {o}" for o in list(exc.protected_objects)[:5]})
        return envelope_response(
            codes.CONFLICT,
            f"It is still in use by {', '.join(holders)}: remove or finish those first.",
            409,
        )
    response = drf_default_handler(exc, context)
    if response is None:
        # Not an API error DRF knows: let Django's handling (our middleware) decide, 500 included.
        return None
    code = next(
        (c for kind, c in _DRF_CODES if isinstance(exc, kind)),
        codes.BY_STATUS.get(response.status_code, codes.BAD_REQUEST),
    )
    detail = exc.detail if isinstance(exc, drf_exceptions.APIException) else str(exc)
    if isinstance(exc, drf_exceptions.ValidationError) and (refusal := state_refusal(exc)):
        return envelope_response(refusal[0], describe_validation(detail), refusal[1])
    if isinstance(exc, drf_exceptions.ValidationError):
        message = "Invalid input: " + describe_validation(detail)
    else:
        message = "; ".join(_flatten(detail)) or codes.DEFAULT_MESSAGES.get(response.status_code, "")
    headers = {k: v for k, v in response.items() if k in ("WWW-Authenticate", "Allow", "Retry-After")}
    if response.status_code == 401 and "WWW-Authenticate" not in headers:
        headers["WWW-Authenticate"] = 'Bearer realm="api"'
    return envelope_response(code, message, response.status_code, headers)
