"""The Django admin of embedding migrations, with the review page of a cutover that sits in a stage."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from apps.embedding_migrations import engine
from apps.embedding_migrations.models import ConsumerAlias, Cutover, CutoverEvent, EmbeddingSpace, VectorStore
from modelforge.errors import ApiError

ACTIONS = {
    "complete": (engine.complete, "Complete: the store shows the alias on the target; record it done"),
    "roll_back": (engine.roll_back, "Roll back: put the alias back on the source (the target is kept)"),
    "retry": (engine.retry, "Retry the stage: run the recorded stage again"),
}


class ReviewForm(forms.Form):
    action = forms.ChoiceField(choices=[(k, label) for k, (_, label) in ACTIONS.items()])
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000)


class CutoverEventInline(admin.TabularInline):
    model = CutoverEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_stage", "to_stage", "actor", "reason", "detail")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Cutover)
class CutoverAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "alias",
        "source_capability",
        "target_capability",
        "stage",
        "interrupted_at",
        "stage_since",
        "review_link",
    )
    list_filter = ("stage", "same_space")
    readonly_fields = [f.name for f in Cutover._meta.fields]
    inlines = [CutoverEventInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the history of a move is the record of what the store went through

    @admin.display(description="Review")
    def review_link(self, obj: Cutover) -> str:
        url = reverse("admin:embedding_migrations_cutover_review", args=[obj.pk])
        return format_html('<a href="{}">review</a>', url)

    def get_urls(self) -> list[URLPattern]:
        review = path(
            "<uuid:pk>/review/",
            self.admin_site.admin_view(self.review_view),
            name="embedding_migrations_cutover_review",
        )
        return [review, *super().get_urls()]

    def review_view(self, request: HttpRequest, pk: Any) -> HttpResponse:
        """The recorded stage, what the adapter reads from the store now, and the actions."""
        cutover = get_object_or_404(Cutover.objects.select_related("alias__store"), pk=pk)
        if not self.has_change_permission(request, cutover):
            return HttpResponseRedirect(reverse("admin:index"))
        form = ReviewForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            verb, _ = ACTIONS[form.cleaned_data["action"]]
            try:
                verb(cutover.pk, actor=request.user.get_username(), reason=form.cleaned_data["reason"])
            except ApiError as exc:
                self.message_user(request, f"{exc.code}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{form.cleaned_data['action'].replace('_', ' ')}: recorded.")
                return HttpResponseRedirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Review cutover of {cutover.alias}",
            "opts": self.model._meta,
            "cutover": cutover,
            "reading": engine.store_reading(cutover),
            "events": cutover.events.all(),
            "form": form,
        }
        return TemplateResponse(request, "admin/embedding_migrations/cutover/review.html", context)


@admin.register(EmbeddingSpace)
class EmbeddingSpaceAdmin(admin.ModelAdmin):
    list_display = ("capability", "model", "revision", "dimension", "normalized", "pooling", "recorded_at")
    search_fields = ("capability__name", "model")
    readonly_fields = ("recorded_at", "recorded_by")


@admin.register(VectorStore)
class VectorStoreAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "created_at")
    exclude = ("dsn",)  # a connection string may hold a password: set it through the API
    readonly_fields = ("kind", "created_at")  # the adapter is chosen (and the store checked) by the API

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ConsumerAlias)
class ConsumerAliasAdmin(admin.ModelAdmin):
    list_display = ("name", "store", "index", "capability", "query_capability")
    readonly_fields = ("store", "name", "index", "capability", "query_capability", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
