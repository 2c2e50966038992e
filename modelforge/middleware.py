"""Request-wide middleware: correlation ids and the error envelope."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import Http404, HttpRequest, HttpResponse

from modelforge.errors import (
    ENVELOPE_MARKER,
    ApiError,
    codes,
    envelope_response,
    internal_server_error,
)
from modelforge.errors.pages import error_page
from modelforge.logging import accept_or_generate, set_correlation_id

logger = logging.getLogger("modelforge.request")
error_logger = logging.getLogger("modelforge.errors")

HEADER = "X-Correlation-ID"


class CorrelationIdMiddleware:
    """Gives every request a correlation id, echoes it, and logs one line per request with it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        correlation_id = accept_or_generate(request.headers.get(HEADER))
        request.correlation_id = correlation_id  # type: ignore[attr-defined]
        # Not reset when the response leaves: Django logs some responses (django.request) after every
        # middleware has returned, and those lines must carry the id too. Each request sets its own,
        # and under ASGI each request runs in its own context.
        set_correlation_id(correlation_id)
        started = time.monotonic()
        response = self.get_response(request)
        response[HEADER] = correlation_id
        logger.info(
            "%s %s -> %s in %.1f ms",
            request.method,
            request.path,
            response.status_code,
            (time.monotonic() - started) * 1000,
        )
        return response


def _message_from(response: HttpResponse, status: int) -> str:
    """Keep a useful message from a JSON error body produced elsewhere; otherwise the default."""
    if response.get("Content-Type", "").startswith("application/json"):
        try:
            body = json.loads(response.content)
        except (ValueError, UnicodeDecodeError):
            body = None
        if isinstance(body, dict):
            for key in ("message", "detail", "error"):
                if isinstance(body.get(key), str):
                    return body[key]
    return codes.DEFAULT_MESSAGES.get(status, "The request failed.")


class ErrorEnvelopeMiddleware:
    """Rewrites any error response not already in the envelope: Django's own 404/405/403/400 pages,
    DEBUG pages, CSRF failures. A 5xx other than 503 becomes the plain ``Internal Server Error``."""

    KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        status = response.status_code
        if status < 400 or getattr(response, ENVELOPE_MARKER, False):
            return response
        if status >= 500 and status != 503:
            return error_page(request, 500) or internal_server_error()
        if status == 404 and (page := error_page(request, 404)) is not None:
            return page
        headers = {name: response[name] for name in self.KEPT_HEADERS if response.has_header(name)}
        code = codes.BY_STATUS.get(status, codes.BAD_REQUEST)
        return envelope_response(code, _message_from(response, status), status, headers)


class RequestSizeMiddleware:
    """Refuses a body larger than ``MODELFORGE_MAX_REQUEST_BYTES`` by its declared length (Django would
    otherwise answer a generic 400 from deep inside a view). Served over ASGI, the body is refused before
    Django reads it (modelforge/request_bodies.py) and this never sees one; it stays for Django's test
    client and any handler without that layer."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return envelope_response(codes.BAD_REQUEST, "Content-Length is not a number.", 400)
        if limit is not None and declared > limit:
            return envelope_response(
                codes.PAYLOAD_TOO_LARGE,
                f"The request body is {declared} bytes; the limit is {limit} (MODELFORGE_MAX_REQUEST_BYTES).",
                413,
            )
        return self.get_response(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a CSRF refusal in the envelope, saying what to do."""
    return envelope_response(
        codes.CSRF_FAILED,
        f"CSRF verification failed ({reason}); reload the page, or call the API with a Bearer key.",
        403,
    )


class ExceptionMiddleware:
    """Turns an exception raised by a view into the envelope before Django's handlers (and their
    DEBUG pages) see it. Anything unexpected is logged with its traceback and answered with the
    plain 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        return response_for_exception(request, exc)


def response_for_exception(request: HttpRequest, exc: Exception) -> HttpResponse:
    if isinstance(exc, ApiError):
        return envelope_response(exc.code, exc.message, exc.status, exc.headers)
    if isinstance(exc, Http404):
        return error_page(request, 404) or envelope_response(
            codes.NOT_FOUND, codes.DEFAULT_MESSAGES[404], 404
        )
    if isinstance(exc, PermissionDenied):
        return envelope_response(codes.PERMISSION_DENIED, codes.DEFAULT_MESSAGES[403], 403)
    if isinstance(exc, RequestDataTooBig):
        return envelope_response(codes.PAYLOAD_TOO_LARGE, codes.DEFAULT_MESSAGES[413], 413)
    if isinstance(exc, SuspiciousOperation | BadRequest):
        return envelope_response(codes.BAD_REQUEST, codes.DEFAULT_MESSAGES[400], 400)
    error_logger.error(
        "unhandled %s in %s %s", type(exc).__name__, request.method, request.path, exc_info=exc
    )
    return error_page(request, 500) or internal_server_error()
