"""Query filters that refuse a value they cannot read instead of dropping the filter.

django-filter's boolean filter reads an unknown value (``?enabled=flase``, ``?enabled=0``) as "no
filter" and answers with every row, and its number filter takes ``0.5`` for an integer column. Every
list of the API and the dashboard filters through ``FilterSet`` here: a boolean is ``true``/``false``
or ``1``/``0`` (any case), an integer column's filter an integer, and anything else is a
``400 VALIDATION_ERROR`` naming the parameter (``FilterBackend``) or, on a dashboard page, the
message above an empty list (``filtered``). An empty value is the same as leaving the parameter out.
A reference to a row that does not exist (``?node=<a UUID of no node>``) is refused too, as
``400 REFERENCE_NOT_FOUND``: a refusal for what is stored, which the OpenAPI document lists.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django_filters import rest_framework as drf_filters
from django_filters.fields import ModelChoiceField as FilterModelChoiceField

_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def _read_boolean(value: Any) -> bool | None:
    """True or False for a value it can read (``True``, ``"true"``, ``"0"``...), else None."""
    return _BOOLEANS.get(str(value).strip().lower())


class StrictBooleanWidget(forms.Select):
    """The dashboard's any/yes/no select. Select's own reading hands the value on as it came, for the field
    to read or refuse (django-filter's widgets map an unknown value to None first, which drops the filter)."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs, choices=(("", "any"), ("true", "yes"), ("false", "no")))

    def format_value(self, value: Any) -> list[str]:  # type: ignore[override]  # a Select formats a list
        read = _read_boolean(value)
        return [""] if read is None else ["true" if read else "false"]


class StrictBooleanField(forms.NullBooleanField):
    widget = StrictBooleanWidget
    default_error_messages = {"invalid": "%(value)r is not a boolean: use true or false (or 1 or 0)."}

    def to_python(self, value: Any) -> bool | None:  # type: ignore[override]  # None: no filter
        if value is None or not str(value).strip():
            return None
        read = _read_boolean(value)
        if read is None:
            raise ValidationError(self.error_messages["invalid"], code="invalid", params={"value": value})
        return read

    def validate(self, value: Any) -> None:
        return None


class BooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


class IntegerFilter(django_filters.NumberFilter):
    field_class = forms.IntegerField


class ReferenceField(FilterModelChoiceField):
    """A filter's reference to another row by its key: a value that is not a key (``?node=abc`` for a
    UUID) is invalid, and a key of no row is ``does_not_exist``, which the API answers as
    ``REFERENCE_NOT_FOUND`` (a refusal for what is stored, as in a body; modelforge.errors)."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except ValidationError as exc:
            if exc.code != "invalid_choice":
                raise
            model = self.queryset.model
            key = model._meta.get_field(self.to_field_name) if self.to_field_name else model._meta.pk
            try:
                key.to_python(value)
            except ValidationError:
                raise exc from None
            raise ValidationError(
                "No %(model)s has %(value)r.",
                code="does_not_exist",
                params={"model": model._meta.verbose_name, "value": value},
            ) from None


class ReferenceFilter(django_filters.ModelChoiceFilter):
    field_class = ReferenceField


_INTEGERS = (
    models.IntegerField,
    models.BigIntegerField,
    models.SmallIntegerField,
    models.PositiveIntegerField,
    models.PositiveBigIntegerField,
    models.PositiveSmallIntegerField,
)


class FilterSet(django_filters.FilterSet):
    """The base of every filter set: booleans and integer columns read strictly (module docstring)."""

    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        models.BooleanField: {"filter_class": BooleanFilter},
        **{field: {"filter_class": IntegerFilter} for field in _INTEGERS},
        **{
            field: {**django_filters.FilterSet.FILTER_DEFAULTS[field], "filter_class": ReferenceFilter}
            for field in (models.ForeignKey, models.OneToOneField)
        },
    }


class FilterBackend(drf_filters.DjangoFilterBackend):
    """DRF's backend with ``FilterSet`` as the base of the sets it makes from a view's ``filterset_fields``;
    an invalid value is a ``ValidationError`` (400 ``VALIDATION_ERROR``, the parameter named)."""

    filterset_base = FilterSet


def filtered(filterset: django_filters.FilterSet) -> QuerySet[Any]:
    """A dashboard list's rows: the filtered rows, or none when a value could not be read (the page shows
    ``filterset.errors`` instead of a list that ignored the filter)."""
    if filterset.is_bound and not filterset.is_valid():
        return filterset.queryset.none()
    return filterset.qs
