from django.urls import path

from apps.observability import views

app_name = "observability"
urlpatterns = [
    path("nodes/<uuid:pk>/", views.node_telemetry, name="node-telemetry"),
    path("traffic/", views.traffic, name="traffic"),
    path("usage/", views.usage_page, name="usage"),
]
