"""The API's schema class (``DEFAULT_SCHEMA_CLASS``): drf-spectacular's, with the refusals of each
operation that depend on what is stored. A module of its own: modelforge.openapi imports drf-spectacular's
views, which read ``DEFAULT_SCHEMA_CLASS`` as they are imported."""

from __future__ import annotations

from typing import Any

from drf_spectacular import openapi
from drf_spectacular.plumbing import force_instance, get_manager, get_view_model

# An operation extension, ``{code: status}``: the refusals of a well-formed request for what is stored or
# configured (a taken name, a row that does not exist, an expiry already past, a local source outside the
# allowed roots), which no schema keyword can state. ``AutoSchema`` derives the ones the request's
# serializer and the list's filters enforce; a view adds those its own code raises with
# ``extend_schema(extensions={STATE_REFUSALS: {...}})``. bench/fuzz and tests/test_api_fuzz.py accept a
# schema-valid request refused with one of these, and with nothing else (tests/contract_checks.py).
STATE_REFUSALS = "x-modelforge-state-refusals"


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's, with each operation's ``STATE_REFUSALS``."""

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        # Merged here, not in get_extensions: extend_schema(extensions=...) replaces that method.
        operation = super().get_operation(*args, **kwargs)
        if operation is not None:
            refusals = {**self._derived_state_refusals(), **operation.get(STATE_REFUSALS, {})}
            if refusals:
                operation[STATE_REFUSALS] = dict(sorted(refusals.items()))
        return operation

    def _derived_state_refusals(self) -> dict[str, int]:
        """1. A body's writable reference to another row: REFERENCE_NOT_FOUND. 2. A writable field that
        must be unique (or a set of them): NAME_TAKEN. 3. The codes a serializer's own validation raises
        (``openapi_state_refusals``, ``{code: status}``; for PATCH also
        ``openapi_partial_state_refusals``). 4. A list filtered by a reference:
        REFERENCE_NOT_FOUND."""
        from rest_framework import serializers
        from rest_framework.validators import UniqueTogetherValidator, UniqueValidator

        from modelforge.errors import STATE_REFUSALS as BY_DRF_CODE
        from modelforge.errors import codes
        from modelforge.filters import ReferenceFilter

        status = {code: status for _, code, status in BY_DRF_CODE}
        found: set[str] = set()
        declared: dict[str, int] = {}
        # Only where drf-spectacular itself asks for them: a guess elsewhere is a warning of `check`.
        serializer = (
            force_instance(self.get_request_serializer()) if self.method in ("POST", "PUT", "PATCH") else None
        )
        if isinstance(serializer, serializers.ListSerializer):
            serializer = serializer.child
        if isinstance(serializer, serializers.Serializer):
            for field in serializer.fields.values():
                if field.read_only:
                    continue
                if isinstance(field, serializers.RelatedField | serializers.ManyRelatedField):
                    found.add(codes.REFERENCE_NOT_FOUND)
                if any(isinstance(v, UniqueValidator) for v in field.validators):
                    found.add(codes.NAME_TAKEN)
            if any(isinstance(v, UniqueTogetherValidator) for v in serializer.validators):
                found.add(codes.NAME_TAKEN)
            declared.update(getattr(serializer, "openapi_state_refusals", {}))
            if self.method == "PATCH":  # drf-spectacular makes its PATCH serializer partial likewise
                declared.update(getattr(serializer, "openapi_partial_state_refusals", {}))
        filtered = any(getattr(self.view, name, None) for name in ("filterset_class", "filterset_fields"))
        if self.method == "GET" and filtered and self._is_list_view():
            model = get_view_model(self.view, emit_warnings=False)
            for backend in getattr(self.view, "filter_backends", ()) if model is not None else ():
                get_class = getattr(backend(), "get_filterset_class", None)
                filterset = get_class(self.view, get_manager(model).none()) if get_class else None
                if filterset and any(isinstance(f, ReferenceFilter) for f in filterset.base_filters.values()):
                    found.add(codes.REFERENCE_NOT_FOUND)
        return {**{code: status[code] for code in found}, **declared}
