from rest_framework.routers import SimpleRouter

from apps.alerts.api.views import AlertViewSet, NotificationChannelViewSet, NotificationViewSet

router = SimpleRouter(trailing_slash=False)
router.register("alerts", AlertViewSet, basename="alert")
router.register("notification-channels", NotificationChannelViewSet, basename="notification-channel")
router.register("notifications", NotificationViewSet, basename="notification")
urlpatterns = router.urls
