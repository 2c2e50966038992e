"""drf-spectacular additions: the error envelope on every operation, and our authentication schemes."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

ENVELOPE = {
    "type": "object",
    "description": "Every error response: exactly these three keys (docs/TROUBLESHOOTING.md).",
    "properties": {
        "code": {"type": "string", "example": "VALIDATION_ERROR"},
        "message": {"type": "string", "description": "What is wrong and what to do."},
        "correlation_id": {
            "type": "string",
            "description": "Also in the X-Correlation-ID header and the logs.",
        },
    },
    "required": ["code", "message", "correlation_id"],
    "additionalProperties": False,
}

ERROR_STATUSES = {
    "400": "Bad request or invalid input",
    "401": "Not authenticated",
    "403": "Not allowed",
    "404": "Not found",
    "405": "Method not allowed",
    "409": "Conflict with the current state",
    "413": "Request body too large",
    "429": "Too many requests",
    "503": "A dependency or capacity is unavailable",
}


def declare_error_envelope(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    components = result.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = ENVELOPE
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status, description in ERROR_STATUSES.items():
                operation["responses"].setdefault(status, {"description": description, "content": ref})
    return result


class OperatorKeyScheme(OpenApiAuthenticationExtension):
    """Declares the operator API key as an HTTP bearer scheme."""

    target_class = "modelforge.auth.OperatorKeyAuthentication"
    name = "operatorKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Authorization: Bearer <MODELFORGE_OPERATOR_API_KEY>",
        }


class StaffSessionScheme(OpenApiAuthenticationExtension):
    """Declares the staff session cookie (CSRF token required for writes)."""

    target_class = "modelforge.auth.StaffSessionAuthentication"
    name = "staffSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
