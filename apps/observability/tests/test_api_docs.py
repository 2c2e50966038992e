"""The API browser: Swagger UI served from local static files (drf-spectacular-sidecar), operators only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

pytestmark = pytest.mark.django_db


def test_a_browser_without_a_session_is_sent_to_log_in(client):
    answer = client.get("/api/v1/docs/")
    assert answer.status_code == 302 and answer["Location"].startswith("/login/?next=/api/v1/docs/")


def test_staff_get_swagger_ui_from_local_static_files(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/api/v1/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "/api/v1/schema/" in html and "cdn" not in html.lower() and "https://" not in html
    assert "API docs" in client.get("/").content.decode()  # the header's link
    assert client.get("/api/v1/schema/").status_code == 200  # the raw schema stays reachable


def test_the_operator_key_may_read_it_and_others_may_not(operator_client, anonymous_client, client):
    assert operator_client.get("/api/v1/docs/").status_code == 200
    refused = anonymous_client.get("/api/v1/docs/", HTTP_AUTHORIZATION="Bearer wrong")
    assert refused.status_code == 401 and refused.json()["code"]
    client.force_login(User.objects.create_user("viewer", is_staff=False))
    assert client.get("/api/v1/docs/").status_code == 403
