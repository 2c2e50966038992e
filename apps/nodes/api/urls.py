from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.nodes.api import views

router = SimpleRouter(trailing_slash=False)
router.register("nodes", views.NodeViewSet, basename="node")
router.register("enrollment-tokens", views.EnrollmentTokenViewSet, basename="enrollment-token")

urlpatterns = [
    path("agent/enroll", views.EnrollView.as_view(), name="agent-enroll"),
    *router.urls,
]
