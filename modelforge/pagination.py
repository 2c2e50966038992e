"""The API's pagination: ``limit`` and ``offset``, bounded, and refused by name when out of range.

DRF's ``LimitOffsetPagination`` passed any ``limit`` on to PostgreSQL (``?limit=9223372036854775808`` was a
500: out of bigint's range) and read a malformed one as the default page. Here a ``limit`` is a whole number
from 1 to ``MODELFORGE_API_MAX_PAGE_SIZE`` and an ``offset`` one from 0 to bigint's largest; anything else is
``400 VALIDATION_ERROR`` naming the parameter, never a guess (docs/DECISIONS.md, 2026-11-30).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

BIGINT_MAX = 2**63 - 1


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``DEFAULT_PAGINATION_CLASS``: pages of ``PAGE_SIZE`` (50) unless ``limit`` asks otherwise."""

    def get_limit(self, request: Request) -> int:
        largest = _max_page_size()
        return _bounded(
            request, self.limit_query_param, 1, largest, min(int(self.default_limit or 1), largest)
        )

    def get_offset(self, request: Request) -> int:
        return _bounded(request, self.offset_query_param, 0, BIGINT_MAX, 0)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """The bounds in the OpenAPI schema too, so a client (or a fuzzer) knows them before asking."""
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": _max_page_size()},
            self.offset_query_param: {"minimum": 0, "maximum": BIGINT_MAX},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters


def _max_page_size() -> int:
    return int(settings.API_MAX_PAGE_SIZE)  # read per request: a test may change it


def _bounded(request: Request, name: str, lowest: int, highest: int, default: int) -> int:
    raw = request.query_params.get(name, "")
    if raw == "":
        return default
    # ASCII digits only (str.isdigit takes other scripts' digits too), and no more of them than the bound
    # has: int() of a long enough string is slow, then refused by Python itself.
    if (
        not (raw.isascii() and raw.isdigit())
        or len(raw) > len(str(highest))
        or not lowest <= int(raw) <= highest
    ):
        raise ValidationError({name: [f"A whole number from {lowest} to {highest}."]})
    return int(raw)
