from rest_framework.routers import SimpleRouter

from apps.clusters.api import views

router = SimpleRouter(trailing_slash=False)
router.register("capabilities", views.CapabilityViewSet, basename="capability")
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("cluster-members", views.ClusterMemberViewSet, basename="cluster-member")
router.register("routing-tiers", views.RoutingTierViewSet, basename="routing-tier")
router.register("client-credentials", views.ClientCredentialViewSet, basename="client-credential")
router.register("project-limits", views.ProjectLimitsViewSet, basename="project-limits")
urlpatterns = router.urls
