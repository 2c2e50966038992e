from rest_framework.routers import SimpleRouter

from apps.servers.api.views import ModelServerViewSet

router = SimpleRouter(trailing_slash=False)
router.register("servers", ModelServerViewSet, basename="server")
urlpatterns = router.urls
