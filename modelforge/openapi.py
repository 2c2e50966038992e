"""drf-spectacular additions: the error envelope on every operation, our authentication schemes, and the
API browser (``/api/v1/docs/``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from drf_spectacular.utils import OpenApiResponse
from drf_spectacular.views import SpectacularSwaggerView

from modelforge.autoschema import STATE_REFUSALS

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


# An OpenApiParameter extension: this query parameter refuses an empty value (allowEmptyValue: false).
EMPTY_REFUSED = "x-modelforge-empty-refused"


def declare_error_envelope(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """Every operation documents the envelope for every error status it can answer, and every optional
    query parameter says that an empty value is the same as leaving it out (DRF and django-filter read
    ``?state=`` so; tests/test_api_fuzz.py holds the schema to it), unless the view marked it
    ``EMPTY_REFUSED``."""
    components = result.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = ENVELOPE
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            statuses = dict(ERROR_STATUSES)
            if "requestBody" in operation:
                statuses["415"] = "The body is not JSON (Content-Type: application/json)"
            for status, description in statuses.items():
                operation["responses"].setdefault(status, {"description": description, "content": ref})
            refusals = operation.get(STATE_REFUSALS, {})
            for status in sorted({str(status) for status in refusals.values()}):
                named = ", ".join(code for code, s in refusals.items() if str(s) == status)
                response = operation["responses"].setdefault(status, {"content": ref})
                response["description"] = (
                    f"{response.get('description', '')}; or, for what is stored: {named}"
                ).lstrip("; ")
            for parameter in operation.get("parameters", []):
                if parameter.pop(EMPTY_REFUSED, False):
                    parameter["allowEmptyValue"] = False
                elif parameter.get("in") == "query" and not parameter.get("required"):
                    parameter.setdefault("allowEmptyValue", True)
    return result


def error_response(description: str) -> OpenApiResponse:
    """An error status an operation answers beyond ERROR_STATUSES, with the envelope as its body."""
    return OpenApiResponse(response={"$ref": "#/components/schemas/Error"}, description=description)


# Characters PrintableText refuses (modelforge.validators), as a JSON Schema character class: controls
# (Cc), U+2028/U+2029 and the bidi controls; free text keeps tab, line feed and carriage return.
_REFUSED = "\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069"
_REFUSED_IN_FREE_TEXT = (
    "\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f\\u2028\\u2029"
    "\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069"
)
# What str.strip() removes: a field that may not be blank needs one character besides these.
_WHITESPACE = (
    "\\t\\n\\u000b\\u000c\\r\\u001c-\\u001f \\u0085\\u00a0\\u1680\\u2000-\\u200a"
    "\\u2028\\u2029\\u202f\\u205f\\u3000"
)


# A text that DRF does not trim to blank: one character that is not white space.
NOT_BLANK = f"[^{_WHITESPACE}]"


def printable_pattern(*, free_text: bool, allow_blank: bool, trimmed: bool = False) -> str:
    """The pattern of a PrintableText field: no refused character, and one that is not white space
    unless the field may be blank (DRF trims before its blank check); ``trimmed``: no white space at
    either end either (``PrintableText.trimmed_fields``)."""
    refused = _REFUSED_IN_FREE_TEXT if free_text else _REFUSED
    if trimmed:
        text = f"[^{refused}{_WHITESPACE}]([^{refused}]*[^{refused}{_WHITESPACE}])?"
        return f"^({text})?$" if allow_blank else f"^{text}$"
    if allow_blank:
        return f"^[^{refused}]*$"
    return f"^[^{refused}]*[^{refused}{_WHITESPACE}][^{refused}]*$"


class PrintableTextSchema(OpenApiSerializerExtension):
    """The request schema of a ``PrintableText`` serializer states what the server enforces beyond the
    fields' own types: the printable-text pattern on every writable text field without a pattern of its
    own, and the serializer's ``openapi_rules`` (``openapi_partial_rules`` for PATCH): rules across
    fields, such as ``anyOf`` required keys or ``additionalProperties: false``."""

    target_class = "modelforge.validators.PrintableText"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        from rest_framework import serializers

        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction != "request":
            return schema
        serializer = self.target
        properties = schema.get("properties", {})
        free_text = getattr(serializer, "free_text_fields", ())
        trimmed = getattr(serializer, "trimmed_fields", ())
        for name, field in serializer.fields.items():
            prop = properties.get(name)
            if prop is None or field.read_only or not isinstance(field, serializers.CharField):
                continue
            if "pattern" not in prop:
                prop["pattern"] = printable_pattern(
                    free_text=name in free_text,
                    allow_blank=bool(field.allow_blank),
                    trimmed=name in trimmed,
                )
        partial = getattr(serializer, "partial", False)
        schema.update(getattr(serializer, "openapi_partial_rules" if partial else "openapi_rules", {}))
        return schema


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


_swagger_ui = SpectacularSwaggerView.as_view(url_name="api:schema")


def api_docs(request: HttpRequest) -> HttpResponse:
    """The API browser: Swagger UI from local static files (drf-spectacular-sidecar), reading the schema.

    Operators only, as the schema is (``SERVE_PERMISSIONS``): a browser without a session goes to the
    log-in page rather than to a JSON refusal; a call with an ``Authorization`` header is judged by the
    operator key's authentication as any API call is."""
    if not request.user.is_authenticated and "HTTP_AUTHORIZATION" not in request.META:
        return redirect_to_login(request.get_full_path(), resolve_url(settings.LOGIN_URL))
    return _swagger_ui(request)
