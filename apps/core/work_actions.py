"""The operator's two answers to waiting work, said the same way from the API, the dashboard's Work page
and the admin: retry (send its work again) and mark failed (``WORK_CANCELLED``). The work itself is
``apps.core.work``; this module only words the outcome and gives every admin the same two actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Max, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from apps.core import work
from apps.core.templatetags.units import format_age
from modelforge.errors import ApiError


def mark_failed(kind: str, pk: str, by: str) -> work.Waiting:
    """``work.fail``, answering with the row as it was when it was marked failed."""
    item = work.find(kind, pk)
    work.fail(kind, pk, by)
    return item


def called(item: work.Waiting) -> str:
    """``backup #3``, ``server echo``: the row's name with its kind, said once."""
    return item.name if item.name.startswith(item.kind) else f"{item.kind} {item.name}"


def retried_message(item: work.Waiting) -> str:
    return f"Retried {called(item)}: its work was sent again."


def failed_message(item: work.Waiting) -> str:
    return f"Marked {called(item)} failed (it was {item.state})."


class WorkAdminActions(admin.ModelAdmin):
    """Retry and mark failed for a model whose rows wait on background work (``work_kind`` in
    ``apps.core.work.KINDS``). One message per selected row: what was done, or the refusal's code."""

    work_kind: str = ""
    # Where "in this state since" comes from: the newest event row's time (``events__at``, one
    # aggregate in the list's own query), or a field of the row itself (``updated_at``); "" for none.
    state_since_from: str = ""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        if "__" in self.state_since_from:
            queryset = queryset.annotate(state_entered_at=Max(self.state_since_from))
        return queryset

    @admin.display(description="in this state since")
    def state_since(self, obj: Any) -> str:
        field = self.state_since_from
        moment = getattr(obj, "state_entered_at" if "__" in field else field, None) if field else None
        if moment is None:
            return "—"
        return f"{format_age(moment)} ({timezone.localtime(moment):%Y-%m-%d %H:%M})"

    def _each(self, request: HttpRequest, queryset: QuerySet[Any], verb: str) -> None:
        by = request.user.get_username()
        for obj in queryset:
            try:
                if verb == "retry":
                    message = retried_message(work.retry(self.work_kind, str(obj.pk), by))
                else:
                    message = failed_message(mark_failed(self.work_kind, str(obj.pk), by))
            except ApiError as exc:
                refusal = f"Could not {verb} {obj}: {exc.code}: {exc.message}"
                self.message_user(request, refusal, messages.ERROR)
            else:
                self.message_user(request, message, messages.SUCCESS)

    @admin.action(description="Retry (re-send its task)")
    def retry_work(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, "retry")

    @admin.action(description="Mark failed (WORK_CANCELLED)")
    def fail_work(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, "mark failed")
