"""Template context shared by every dashboard page."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest

# The dashboard's sections. Domains whose pages are not built yet are listed without a link, so the
# shape of the product is visible from the first page; each issue that builds one adds its url name.
NAVIGATION: list[dict[str, str | None]] = [
    {"key": "home", "label": "Overview", "url_name": "dashboard:home"},
    {"key": "nodes", "label": "Nodes", "url_name": "nodes:list"},
    {"key": "servers", "label": "Model servers", "url_name": "servers:list"},
    {"key": "clusters", "label": "Clusters", "url_name": "clusters:list"},
    # Next to the credentials (on the Clusters page) whose empty limits they fill in.
    {"key": "project-limits", "label": "Project limits", "url_name": "clusters:project-limits"},
    {"key": "playground", "label": "Playground", "url_name": "clusters:playground"},
    {"key": "artifacts", "label": "Artifacts", "url_name": "artifacts:list"},
    {"key": "backups", "label": "Backups", "url_name": "backups:list"},
    {"key": "migrations", "label": "Migrations", "url_name": "migrations:list"},
    {"key": "alerts", "label": "Alerts", "url_name": "alerts:list"},
    {"key": "work", "label": "Work", "url_name": "dashboard:work"},
]


def navigation(request: HttpRequest) -> dict[str, object]:
    return {
        "navigation": NAVIGATION,
        "modelforge_release": settings.RELEASE,
        "modelforge_env": settings.MODELFORGE_ENV,
    }
