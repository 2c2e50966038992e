from rest_framework.routers import SimpleRouter

from apps.embedding_migrations.api.views import (
    ConsumerAliasViewSet,
    CutoverViewSet,
    EmbeddingSpaceViewSet,
    VectorStoreViewSet,
)

router = SimpleRouter(trailing_slash=False)
router.register("embedding-spaces", EmbeddingSpaceViewSet, basename="embedding-space")
router.register("vector-stores", VectorStoreViewSet, basename="vector-store")
router.register("consumer-aliases", ConsumerAliasViewSet, basename="consumer-alias")
router.register("cutovers", CutoverViewSet, basename="cutover")
urlpatterns = router.urls
