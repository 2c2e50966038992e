"""The API of embedding migrations: spaces, vector stores, consumer aliases, cutovers and their actions."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.embedding_migrations import codes, engine, spaces
from apps.embedding_migrations.adapters import AdapterError
from apps.embedding_migrations.api.serializers import (
    ActionSerializer,
    ConsumerAliasSerializer,
    CreateIndexSerializer,
    CutoverSerializer,
    DeclareSpaceSerializer,
    EmbeddingSpaceSerializer,
    MeasureSpaceSerializer,
    OptionalReasonSerializer,
    PlanCutoverSerializer,
    VectorStoreSerializer,
)
from apps.embedding_migrations.filtersets import CutoverFilterSet
from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace, VectorStore
from modelforge.autoschema import STATE_REFUSALS
from modelforge.errors import ApiError


def _who(request: Request) -> str:
    return str(getattr(request.user, "username", request.user))


class EmbeddingSpaceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """What each capability's vectors are made in (model, revision, dimension, normalisation, pooling).
    ``POST`` declares one; ``measure`` records it from a running backend."""

    queryset = EmbeddingSpace.objects.select_related("capability")
    serializer_class = EmbeddingSpaceSerializer
    filterset_fields = ["model", "dimension"]

    @extend_schema(request=DeclareSpaceSerializer, responses={201: EmbeddingSpaceSerializer})
    def create(self, request: Request) -> Response:
        data = DeclareSpaceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        capability = values.pop("capability")
        space = spaces.record_space(capability, values, actor=_who(request))
        return Response(EmbeddingSpaceSerializer(space).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=MeasureSpaceSerializer, responses={201: EmbeddingSpaceSerializer})
    @action(detail=False, methods=["post"])
    def measure(self, request: Request) -> Response:
        """Embed two probe texts on a running backend of the capability and record what came back."""
        data = MeasureSpaceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        space = spaces.measure_space(
            data.validated_data["capability"], actor=_who(request), pooling=data.validated_data["pooling"]
        )
        return Response(EmbeddingSpaceSerializer(space).data, status=status.HTTP_201_CREATED)


# perform_create: the store at the DSN must answer, which no schema can state (modelforge.autoschema).
@extend_schema_view(create=extend_schema(extensions={STATE_REFUSALS: {codes.STORE_UNAVAILABLE: 400}}))
class VectorStoreViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Vector stores, each reached only through its typed adapter (``pgvector``). Registering one checks
    that it answers and can hold vectors (``STORE_UNAVAILABLE`` otherwise)."""

    queryset = VectorStore.objects.all()
    serializer_class = VectorStoreSerializer
    filterset_fields = ["kind"]

    def perform_create(self, serializer: Any) -> None:
        store = VectorStore(**serializer.validated_data)
        try:
            store.adapter().ping()
        except AdapterError as exc:
            raise ApiError(
                codes.STORE_UNAVAILABLE, f"dsn: the store did not answer: {exc.message}", 400
            ) from None
        serializer.save()

    @extend_schema(
        methods=["GET"], responses={200: OpenApiResponse(description="The indexes this adapter created.")}
    )
    @extend_schema(
        methods=["POST"],
        request=CreateIndexSerializer,
        responses={201: OpenApiResponse(description="The index, empty, in the capability's space.")},
    )
    @action(detail=True, methods=["get", "post"])
    def indexes(self, request: Request, pk: Any = None) -> Response:
        """The indexes in the store; ``POST`` creates an empty one in a capability's space, for an
        application's first vectors (a consumer alias is then bound over it)."""
        store = self.get_object()
        try:
            adapter = store.adapter()
            if request.method == "POST":
                data = CreateIndexSerializer(data=request.data)
                data.is_valid(raise_exception=True)
                capability = data.validated_data["capability"]
                space = spaces.space_of(capability)
                if space is None:
                    raise ApiError(
                        codes.EMBEDDING_SPACE_UNKNOWN,
                        f"{capability.name}'s embedding space is not recorded: measure or declare it first.",
                        409,
                    )
                adapter.create_target(data.validated_data["name"], dimension=space.dimension, space=space.key)
                made = adapter.info(data.validated_data["name"])
                return Response(_index(made), status=status.HTTP_201_CREATED)
            return Response([_index(i) for i in adapter.list_indexes()])
        except AdapterError as exc:
            raise ApiError(
                exc.code, exc.message, 503 if exc.code == codes.STORE_UNAVAILABLE else 409
            ) from None


def _index(info: Any) -> dict[str, Any]:
    return {"name": info.name, "space": info.space, "dimension": info.dimension, "count": info.count}


class ConsumerAliasViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A consumer's alias in a store and its query name (a capability that follows the alias's space).
    Binding one to an index of another space is ``REQUIRES_REINDEX``."""

    queryset = ConsumerAlias.objects.select_related("store", "capability", "query_capability")
    serializer_class = ConsumerAliasSerializer
    filterset_fields = ["store", "capability"]

    @extend_schema(request=ConsumerAliasSerializer, responses={201: ConsumerAliasSerializer})
    def create(self, request: Request) -> Response:
        data = ConsumerAliasSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        alias = engine.create_alias(
            store=values["store"],
            name=values["name"],
            index=values["index"],
            capability=values["capability"],
            query_capability=values["query_capability"]["name"],
            actor=_who(request),
        )
        return Response(ConsumerAliasSerializer(alias).data, status=status.HTTP_201_CREATED)


class CutoverViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Cutovers of an alias between embedding spaces: ``planned → provisioning → reindexing → verifying →
    ready_to_cut → cutting_over → completed`` (or ``rolled_back`` / ``failed``). An interrupted stage stays
    where it stopped until an operator completes, rolls back or retries it (``reason`` required)."""

    queryset = Cutover.objects.select_related(
        "alias__store", "source_capability", "target_capability"
    ).prefetch_related("events")
    serializer_class = CutoverSerializer
    filterset_class = CutoverFilterSet

    @extend_schema(request=PlanCutoverSerializer, responses={201: CutoverSerializer})
    def create(self, request: Request) -> Response:
        data = PlanCutoverSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cutover = engine.plan(
            alias=data.validated_data["alias"],
            target=data.validated_data["target_capability"],
            actor=_who(request),
            batch_size=data.validated_data["batch_size"],
        )
        return Response(self._fresh(cutover.pk), status=status.HTTP_201_CREATED)

    def _fresh(self, pk: Any) -> dict[str, Any]:
        return CutoverSerializer(self.get_queryset().get(pk=pk)).data

    def _act(self, request: Request, verb: Any, serializer: type, accepted: bool) -> Response:
        data = serializer(data=request.data)
        data.is_valid(raise_exception=True)
        cutover = self.get_object()
        reason = data.validated_data["reason"] or verb.__name__.replace("_", " ")
        with transaction.atomic():
            verb(cutover.pk, actor=_who(request), reason=reason)
        return Response(
            self._fresh(cutover.pk), status=status.HTTP_202_ACCEPTED if accepted else status.HTTP_200_OK
        )

    @extend_schema(request=OptionalReasonSerializer, responses={202: CutoverSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: Any = None) -> Response:
        """Provision, reindex and verify (a same-space move goes straight to ready_to_cut)."""
        return self._act(request, engine.start, OptionalReasonSerializer, True)

    @extend_schema(request=OptionalReasonSerializer, responses={202: CutoverSerializer})
    @action(detail=True, methods=["post"])
    def cut(self, request: Request, pk: Any = None) -> Response:
        """Swap the alias and its query name to the target: ``REQUIRES_REINDEX`` before a verified reindex."""
        return self._act(request, engine.cut, OptionalReasonSerializer, True)

    @extend_schema(request=ActionSerializer, responses={200: CutoverSerializer})
    @action(detail=True, methods=["post"])
    def complete(self, request: Request, pk: Any = None) -> Response:
        """After an interrupted cut-over the store shows swapped: record it complete."""
        return self._act(request, engine.complete, ActionSerializer, False)

    @extend_schema(request=ActionSerializer, responses={200: CutoverSerializer})
    @action(detail=True, methods=["post"], url_path="roll-back")
    def roll_back(self, request: Request, pk: Any = None) -> Response:
        """Put the alias back on the source (the target index is kept for inspection)."""
        return self._act(request, engine.roll_back, ActionSerializer, False)

    @extend_schema(request=ActionSerializer, responses={202: CutoverSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: Any = None) -> Response:
        """Run the interrupted or failed stage again (every stage is idempotent on the store)."""
        return self._act(request, engine.retry, ActionSerializer, True)

    @extend_schema(responses={200: OpenApiResponse(description="What the adapter reads from the store now.")})
    @action(detail=True, methods=["get"])
    def store(self, request: Request, pk: Any = None) -> Response:
        """The alias's actual target and each index's count, space and dimension, read now."""
        return Response(engine.store_reading(self.get_object()))
