"""The API's JSON parser: DRF's, with the body's nesting depth and NUL characters bounded.

DRF's ``JSONParser`` recurses once per level of nesting, so a body nested a few thousand deep was a
``RecursionError``: a 500, unauthenticated on ``/api/v1/agent/enroll``, with a traceback logged each time.
A NUL character (``\\u0000``) is valid JSON that PostgreSQL's text and jsonb cannot store: a 500 when it
reached a column. Both are refused here, on the bytes, before any serializer sees the data
(modelforge/jsonbounds.py has the checks, shared with the serving gateway).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.utils.json import strict_constant

from modelforge.jsonbounds import MAX_JSON_DEPTH, TOO_DEEP_MESSAGE, json_has_nul, json_too_deep, nul_message

__all__ = ["MAX_JSON_DEPTH", "BoundedJSONParser"]


class BoundedJSONParser(JSONParser):
    """``DEFAULT_PARSER_CLASSES``: JSON no deeper than ``MAX_JSON_DEPTH`` (``400 JSON_TOO_DEEP``) and
    without a NUL in any key or string (``400 VALIDATION_ERROR`` naming where)."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        # Not at the top: DRF's settings import this module while modelforge.errors is still importing DRF.
        from modelforge.errors import ApiError, codes

        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        raw = stream.read()
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        # The checks read UTF-8 bytes: a body in another encoding is checked as its UTF-8 equivalent.
        body = raw if encoding.lower().replace("-", "") == "utf8" else text.encode("utf-8", "surrogatepass")
        if json_too_deep(body):
            raise ApiError(codes.JSON_TOO_DEEP, TOO_DEEP_MESSAGE)
        try:
            data = json.loads(text, parse_constant=strict_constant if self.strict else None)
        except RecursionError:
            # Brackets that never close are not counted as depth (not JSON at all); the parser still
            # recurses into them, up to Python's own limit.
            raise ApiError(codes.JSON_TOO_DEEP, TOO_DEEP_MESSAGE) from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if json_has_nul(body):
            raise ApiError(codes.VALIDATION_ERROR, "Invalid input: " + nul_message(body))
        return data
