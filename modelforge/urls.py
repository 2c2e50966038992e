from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView

from modelforge import health, metrics, openapi  # openapi registers the schema extensions

api_patterns: list[URLPattern | URLResolver] = [
    path("", include("apps.core.api.urls")),
    path("", include("apps.nodes.api.urls")),
    path("", include("apps.alerts.api.urls")),
    path("", include("apps.servers.api.urls")),
    path("", include("apps.clusters.api.urls")),
    path("", include("apps.artifacts.api.urls")),
    path("", include("apps.backups.api.urls")),
    path("", include("apps.observability.api.urls")),
    path("", include("apps.embedding_migrations.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", openapi.api_docs, name="docs"),
]

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/v1/", include((api_patterns, "api"))),
    path("admin/", admin.site.urls),
    path("nodes/", include("apps.nodes.urls")),
    path("alerts/", include("apps.alerts.urls")),
    path("servers/", include("apps.servers.urls")),
    path("clusters/", include("apps.clusters.urls")),
    path("artifacts/", include("apps.artifacts.urls")),
    path("backups/", include("apps.backups.urls")),
    path("observability/", include("apps.observability.urls")),
    path("migrations/", include("apps.embedding_migrations.urls")),
    path("", include("apps.core.urls")),
]

__all__ = ["openapi", "urlpatterns"]

admin.site.site_header = "ModelForge administration"
admin.site.site_title = "ModelForge admin"
