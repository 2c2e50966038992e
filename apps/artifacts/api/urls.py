from rest_framework.routers import SimpleRouter

from apps.artifacts.api.views import ArtifactViewSet

router = SimpleRouter(trailing_slash=False)
router.register("artifacts", ArtifactViewSet, basename="artifact")
urlpatterns = router.urls
