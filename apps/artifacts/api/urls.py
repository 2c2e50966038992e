from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.artifacts.agent_views import artifact_file
from apps.artifacts.api.views import ArtifactViewSet, ReplicaViewSet

router = SimpleRouter(trailing_slash=False)
router.register("artifacts", ArtifactViewSet, basename="artifact")
router.register("replicas", ReplicaViewSet, basename="replica")
urlpatterns = [
    path("agent/artifacts/<int:pk>/files/<path:path>", artifact_file, name="agent-artifact-file"),
    *router.urls,
]
