from rest_framework.routers import SimpleRouter

from apps.artifacts.api.views import ArtifactViewSet, ReplicaViewSet

router = SimpleRouter(trailing_slash=False)
router.register("artifacts", ArtifactViewSet, basename="artifact")
router.register("replicas", ReplicaViewSet, basename="replica")
# GET /api/v1/agent/artifacts/<id>/files/<path> is served beside Django (apps.artifacts.agent_views).
urlpatterns = router.urls
