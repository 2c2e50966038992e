"""Every error code ModelForge answers with, in one place.

Codes are spelled exactly as the source documents spell them; docs/TROUBLESHOOTING.md has an entry
for each refusal. A code is a value, not a string scattered in views: import it from here.
"""

# --- Generic HTTP errors (the envelope's code when nothing more specific applies) -----------------
BAD_REQUEST = "BAD_REQUEST"
VALIDATION_ERROR = "VALIDATION_ERROR"
MALFORMED_REQUEST = "MALFORMED_REQUEST"
# JSON nested deeper than modelforge.jsonbounds.MAX_JSON_DEPTH (a parser would recurse into a 500).
JSON_TOO_DEEP = "JSON_TOO_DEEP"
NOT_AUTHENTICATED = "NOT_AUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
NOT_FOUND = "NOT_FOUND"
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
NOT_ACCEPTABLE = "NOT_ACCEPTABLE"
CONFLICT = "CONFLICT"
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
# A ``Range`` that starts at or past the end of the file (the store's artifact files, apps.artifacts).
RANGE_NOT_SATISFIABLE = "RANGE_NOT_SATISFIABLE"
# A request's headers or body did not arrive within MODELFORGE_HTTP_*_TIMEOUT_S (modelforge/http_protocol.py).
REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
# A request's line and headers over modelforge.http_protocol.MAX_HEADER_BYTES (64 KiB).
HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
RATE_LIMITED = "RATE_LIMITED"
SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
CSRF_FAILED = "CSRF_FAILED"

# --- A well-formed request refused for what is stored (or for the clock), not for its shape -----------
# Named apart from VALIDATION_ERROR so that a client, and bench/fuzz, can tell the two apart; each
# operation that can answer one lists it in the OpenAPI document (modelforge.openapi.STATE_REFUSALS).
NAME_TAKEN = "NAME_TAKEN"  # 409: another row already has this name (or this project, this key)
REFERENCE_NOT_FOUND = "REFERENCE_NOT_FOUND"  # 400: a row the body or the query names does not exist
EXPIRY_IN_PAST = "EXPIRY_IN_PAST"  # 400: an expiry that is not in the future
# 409: a partial change that does not suit the values stored with it (a channel's new target judged by its
# stored kind); the same values sent together are judged, and documented, as the body's shape
CONFLICTS_WITH_STORED = "CONFLICTS_WITH_STORED"

# --- Authentication throttling (modelforge.auththrottle; the log-in page's lockout, django-axes) ----
TOO_MANY_AUTH_FAILURES = "TOO_MANY_AUTH_FAILURES"
LOGIN_LOCKED_OUT = "LOGIN_LOCKED_OUT"

# --- Start-up -------------------------------------------------------------------------------------
MISSING_REQUIRED_SETTING = "MISSING_REQUIRED_SETTING"
INSECURE_PRODUCTION_SETTING = "INSECURE_PRODUCTION_SETTING"
INVALID_SETTING = "INVALID_SETTING"
INCOMPATIBLE_DATABASE = "INCOMPATIBLE_DATABASE"

# --- The platform's own stores: /readyz answers 503 with these, and the outage alerts carry them -----
DATABASE_UNREACHABLE = "DATABASE_UNREACHABLE"
BROKER_UNREACHABLE = "BROKER_UNREACHABLE"

# Default code for an error response produced without one (e.g. by Django itself).
BY_STATUS = {
    400: BAD_REQUEST,
    401: NOT_AUTHENTICATED,
    403: PERMISSION_DENIED,
    404: NOT_FOUND,
    405: METHOD_NOT_ALLOWED,
    406: NOT_ACCEPTABLE,
    409: CONFLICT,
    413: PAYLOAD_TOO_LARGE,
    415: UNSUPPORTED_MEDIA_TYPE,
    416: RANGE_NOT_SATISFIABLE,
    429: RATE_LIMITED,
    503: SERVICE_UNAVAILABLE,
}

DEFAULT_MESSAGES = {
    400: "The request is not valid.",
    401: "Authentication is required: send Authorization: Bearer <operator API key> or log in.",
    403: "You are not allowed to do this.",
    404: "Nothing exists at this address.",
    405: "This method is not allowed here.",
    406: "The requested response format is not available.",
    409: "The request conflicts with the current state.",
    413: "The request body is larger than the configured limit (MODELFORGE_MAX_REQUEST_BYTES).",
    415: "The request body's media type is not supported; send application/json.",
    429: "Too many requests; slow down and retry later.",
    503: "The service is temporarily unavailable.",
}
