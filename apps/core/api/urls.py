from django.urls import path

from apps.core.api import views

urlpatterns = [
    path("system/status", views.SystemStatusView.as_view(), name="system-status"),
    path("system/worker-probe", views.WorkerProbeView.as_view(), name="system-worker-probe"),
    path("system/invariants", views.InvariantsView.as_view(), name="system-invariants"),
    path("system/work", views.WorkListView.as_view(), name="system-work"),
    path("system/work/<str:kind>/<str:id>/retry", views.WorkRetryView.as_view(), name="system-work-retry"),
    path("system/work/<str:kind>/<str:id>/fail", views.WorkFailView.as_view(), name="system-work-fail"),
]
