"""Rehydration: one rule (apps.artifacts.services.request_rehydration) for the API and the dashboard. A
quarantined artifact or one with no recorded files is refused up front and nothing is sent (the API used
to answer 202 and let the worker refuse it where nobody saw)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.artifacts.models import Artifact

pytestmark = pytest.mark.django_db

FILES = [{"path": "config.json", "size": 2, "sha256": "0" * 64}]


def artifact(state: str, files: list | None = None) -> Artifact:
    return Artifact.objects.create(
        name=f"a-{state}", source_kind="local", locator="/there", state=state, files=files or []
    )


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True, is_superuser=True))
    return client


def test_the_api_sends_a_rehydration_of_a_ready_artifact(operator_client, django_capture_on_commit_callbacks):
    item = artifact("ready", FILES)
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/artifacts/{item.pk}/rehydrate")
    assert response.status_code == 202
    assert len(sent) == 1


# Regression: answered 202, then the worker refused it with ARTIFACT_QUARANTINED in its own log only.
def test_the_api_refuses_to_rehydrate_a_quarantined_artifact_up_front(
    operator_client, django_capture_on_commit_callbacks
):
    item = artifact("quarantined", FILES)
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/artifacts/{item.pk}/rehydrate")
    assert response.status_code == 409
    assert response.json()["code"] == "ARTIFACT_QUARANTINED"
    assert sent == []


def test_the_api_refuses_to_rehydrate_an_artifact_with_no_recorded_files(
    operator_client, django_capture_on_commit_callbacks
):
    item = artifact("failed")
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/artifacts/{item.pk}/rehydrate")
    assert response.status_code == 409
    assert response.json()["code"] == "ARTIFACT_HAS_NO_FILES"
    assert "no recorded files" in response.json()["message"]
    assert sent == []


def test_the_dashboard_refuses_a_quarantined_rehydration_with_the_same_code(
    staff, django_capture_on_commit_callbacks
):
    item = artifact("quarantined", FILES)
    with django_capture_on_commit_callbacks() as sent:
        response = staff.post(f"/artifacts/{item.pk}/rehydrate", follow=True)
    assert "ARTIFACT_QUARANTINED" in response.content.decode()
    assert sent == []


def test_the_dashboard_sends_a_rehydration_of_a_ready_artifact(staff, django_capture_on_commit_callbacks):
    item = artifact("ready", FILES)
    with django_capture_on_commit_callbacks() as sent:
        response = staff.post(f"/artifacts/{item.pk}/rehydrate", follow=True)
    assert "Rehydrating a-ready" in response.content.decode()
    assert len(sent) == 1
