"""Text that people read: names, labels and notes hold printable characters only.

A control character (``ESC [31m`` repaints a terminal; a tab or newline breaks a table row) or a
bidirectional-override character (U+202E makes ``evil\\u202etxt.exe`` read ``evilexe.txt``) in a name
is spoofing in the dashboard, the admin, logs and alerts. Every operator-chosen name or label is refused
with ``VALIDATION_ERROR`` when it holds one; free text (a reason, a review note) keeps its line breaks
and tabs but not the rest. ``PrintableText`` applies the rule to every writable text field of a
serializer, so a field added later is covered without anyone remembering to.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, ClassVar

from django.core.exceptions import ValidationError
from rest_framework import serializers

# Every C0 and C1 control and DEL (Unicode category Cc), the line and paragraph separators, and the
# bidirectional controls: ALM, LRM, RLM, the embeddings and overrides (U+202A-U+202E) and the isolates
# (U+2066-U+2069). Zero-width joiners stay: emoji sequences and several scripts need them.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_SINGLE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")
_FREE_TEXT = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")


def _refuse(found: re.Match[str]) -> None:
    char = found.group()
    name = unicodedata.name(char, "a control character")
    raise ValidationError(
        f"Contains U+{ord(char):04X} ({name}) at position {found.start() + 1}: control and "
        "bidirectional-override characters are not accepted here; remove it.",
        code="unprintable",
    )


def single_line(value: Any) -> None:
    """A name or label: printable characters only, on one line."""
    found = _SINGLE_LINE.search(value) if isinstance(value, str) else None
    if found:
        _refuse(found)


def free_text(value: Any) -> None:
    """A reason or note: printable characters, line breaks and tabs."""
    found = _FREE_TEXT.search(value) if isinstance(value, str) else None
    if found:
        _refuse(found)


class PrintableText(serializers.Serializer):
    """A serializer mixin: every writable text field (``CharField`` and its kinds: regex, e-mail, URL ...)
    refuses control and bidi-override characters; those named in ``free_text_fields`` keep line breaks
    and tabs. Put it first among the bases: ``class X(PrintableText, serializers.ModelSerializer)``."""

    free_text_fields: ClassVar[tuple[str, ...]] = ()
    # Fields whose own validation (``validate_<name>``) refuses white space at either end: their OpenAPI
    # pattern says so too (modelforge.openapi.printable_pattern).
    trimmed_fields: ClassVar[tuple[str, ...]] = ()
    # Rules across fields that the serializer enforces, stated in its OpenAPI request schema (JSON Schema
    # keywords merged in by modelforge.openapi.PrintableTextSchema); the partial ones for PATCH.
    openapi_rules: ClassVar[dict[str, Any]] = {}
    openapi_partial_rules: ClassVar[dict[str, Any]] = {}

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        for name, field in fields.items():
            if isinstance(field, serializers.CharField) and not field.read_only:
                field.validators.append(free_text if name in self.free_text_fields else single_line)
        return fields


def checked_text(field: str, value: str, *, lines: bool = False) -> str:
    """``value`` when it passes the rule (``lines``: free text), for a dashboard form that records text
    without a serializer; otherwise ``ApiError(VALIDATION_ERROR)`` naming ``field``, as the API says it."""
    from modelforge.errors import ApiError, codes

    try:
        (free_text if lines else single_line)(value)
    except ValidationError as exc:
        raise ApiError(codes.VALIDATION_ERROR, f"Invalid input: {field}: {exc.messages[0]}") from None
    return value
