"""Error pages for the dashboard: a 404 or a 500 on a page a person reads is an HTML page in the layout;
the API (``/api/``), the gateway (``/v1``) and the probes keep the JSON envelope that machines parse."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from modelforge.errors import ENVELOPE_MARKER, codes
from modelforge.logging import current_correlation_id

logger = logging.getLogger("modelforge.errors")

# Addresses that machines call: their errors stay in the envelope whatever the status.
MACHINE_PREFIXES = ("/api/", "/v1/", "/healthz", "/readyz", "/metrics")
PAGES = {404: "errors/404.html", 500: "errors/500.html"}


def is_dashboard(request: HttpRequest) -> bool:
    path = request.path
    return path != "/v1" and not path.startswith(MACHINE_PREFIXES)


def error_page(request: HttpRequest, status: int) -> HttpResponse | None:
    """The HTML page for ``status`` on a dashboard address, or None where the envelope applies.

    A page that cannot itself be rendered (the database is what failed, say) gives None: the caller
    falls back to the plain answer rather than raising from inside error handling."""
    if status not in PAGES or not is_dashboard(request):
        return None
    context = {
        "status": status,
        "message": codes.DEFAULT_MESSAGES.get(status, "Something went wrong on our side."),
        "correlation_id": current_correlation_id(),
        "path": request.path,
    }
    try:
        body = render_to_string(PAGES[status], context, request=request)
    except Exception:
        logger.exception("the %s page could not be rendered for %s", status, request.path)
        return None
    response = HttpResponse(body, status=status)
    setattr(response, ENVELOPE_MARKER, True)
    return response
