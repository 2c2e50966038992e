"""Every error code ModelForge answers with, in one place.

Codes are spelled exactly as the source documents spell them; docs/TROUBLESHOOTING.md has an entry
for each refusal. A code is a value, not a string scattered in views: import it from here.
"""

# --- Generic HTTP errors (the envelope's code when nothing more specific applies) -----------------
BAD_REQUEST = "BAD_REQUEST"
VALIDATION_ERROR = "VALIDATION_ERROR"
MALFORMED_REQUEST = "MALFORMED_REQUEST"
NOT_AUTHENTICATED = "NOT_AUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
NOT_FOUND = "NOT_FOUND"
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
NOT_ACCEPTABLE = "NOT_ACCEPTABLE"
CONFLICT = "CONFLICT"
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
RATE_LIMITED = "RATE_LIMITED"
SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
NOT_READY = "NOT_READY"
CSRF_FAILED = "CSRF_FAILED"

# --- Start-up -------------------------------------------------------------------------------------
MISSING_REQUIRED_SETTING = "MISSING_REQUIRED_SETTING"
INSECURE_PRODUCTION_SETTING = "INSECURE_PRODUCTION_SETTING"
INVALID_SETTING = "INVALID_SETTING"
INCOMPATIBLE_DATABASE = "INCOMPATIBLE_DATABASE"

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
