"""Looking up a record by an id that came from a user (a form field, a JSON body)."""

from __future__ import annotations

from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import models

M = TypeVar("M", bound=models.Model)


def by_pk(queryset: models.QuerySet[M], value: Any) -> M | None:
    """The record with primary key ``value``, or ``None`` when there is none, including when ``value``
    cannot be one at all (``"7"`` or ``"junk"`` for a UUID key raises instead of matching nothing)."""
    if value in (None, ""):
        return None
    try:
        return queryset.filter(pk=value).first()
    except (ValidationError, ValueError, TypeError):
        return None
