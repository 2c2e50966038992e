from rest_framework.routers import SimpleRouter

from apps.backups.api.views import BackupViewSet, RestoreViewSet

router = SimpleRouter(trailing_slash=False)
router.register("backups", BackupViewSet, basename="backup")
router.register("restores", RestoreViewSet, basename="restore")
urlpatterns = router.urls
