from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.nodes.api import views

router = SimpleRouter(trailing_slash=False)
router.register("nodes", views.NodeViewSet, basename="node")
router.register("enrollment-tokens", views.EnrollmentTokenViewSet, basename="enrollment-token")

urlpatterns = [
    path("agent/enroll", views.EnrollView.as_view(), name="agent-enroll"),
    # Before the router: "nodes/{id}" would otherwise take "listening" for a node's id.
    path("nodes/listening", views.ListeningView.as_view(), name="nodes-listening"),
    path("nodes/mass-loss/confirm", views.MassLossConfirmView.as_view(), name="nodes-mass-loss-confirm"),
    *router.urls,
]
