"""Retry of a failed acquisition: one rule (apps.artifacts.services.retry_acquisition), the same answer
from the API, the dashboard and the admin; a refusal is said up front and nothing is sent."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.artifacts.models import Artifact
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


def failed(**fields) -> Artifact:
    return Artifact.objects.create(
        **{"name": "gone", "source_kind": "local", "locator": "/nowhere", "state": "failed", **fields}
    )


def blocked() -> Artifact:
    return failed(name="blocked", failure_code="ARTIFACT_REHYDRATION_BLOCKED")


def ready() -> Artifact:
    return Artifact.objects.create(name="fine", source_kind="local", locator="/there", state="ready")


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True, is_superuser=True))
    return client


# --- API ------------------------------------------------------------------------------------------------


def test_the_api_retries_a_failed_acquisition(operator_client, django_capture_on_commit_callbacks):
    item = failed()
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/artifacts/{item.pk}/retry")
    assert response.status_code == 202
    assert len(sent) == 1


# Regression: the API accepted this with 202 and the task then refused it silently.
def test_the_api_refuses_to_retry_a_blocked_rehydration_up_front(
    operator_client, django_capture_on_commit_callbacks
):
    item = blocked()
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/artifacts/{item.pk}/retry")
    assert response.status_code == 409
    assert response.json()["code"] == "ARTIFACT_REHYDRATION_BLOCKED"
    assert sent == []


def test_the_api_refuses_to_retry_an_artifact_that_did_not_fail(
    operator_client, django_capture_on_commit_callbacks
):
    item = ready()
    with django_capture_on_commit_callbacks() as sent:
        response = operator_client.post(f"/api/v1/artifacts/{item.pk}/retry")
    assert response.status_code == 409
    assert response.json()["code"] == "ARTIFACT_NOT_FAILED"
    assert sent == []


# --- dashboard ------------------------------------------------------------------------------------------


def test_the_dashboard_refuses_to_retry_a_blocked_rehydration_with_the_same_code(
    staff, django_capture_on_commit_callbacks
):
    item = blocked()
    with django_capture_on_commit_callbacks() as sent:
        page = staff.post(f"/artifacts/{item.pk}/retry", follow=True).content.decode()
    assert "ARTIFACT_REHYDRATION_BLOCKED" in page
    assert sent == []


def test_the_dashboard_refuses_to_retry_an_artifact_that_did_not_fail_with_the_same_code(staff):
    page = staff.post(f"/artifacts/{ready().pk}/retry", follow=True).content.decode()
    assert "ARTIFACT_NOT_FAILED" in page


# --- admin ----------------------------------------------------------------------------------------------


def test_the_admin_retries_each_selected_artifact_with_the_same_rule(
    staff, django_capture_on_commit_callbacks
):
    retried, refused = failed(), blocked()
    with django_capture_on_commit_callbacks() as sent:
        response = staff.post(
            "/admin/artifacts/artifact/",
            {"action": "retry_acquisition", "_selected_action": [str(retried.pk), str(refused.pk)]},
            follow=True,
        )
    said = sorted((m.level_tag, str(m)) for m in response.context["messages"])
    assert said[0][0] == "error"
    assert said[0][1].startswith("Could not retry blocked: ARTIFACT_REHYDRATION_BLOCKED: ")
    assert said[1] == ("success", "Acquiring gone again from /nowhere.")
    assert len(sent) == 1


# --- the transition mechanism ---------------------------------------------------------------------------


def test_a_replica_move_leaves_an_event_row_with_who_asked():
    from apps.artifacts.models import Replica
    from apps.nodes.tests.factories import make_node

    node, _ = make_node(name="n1")
    replica = Replica.objects.create(artifact=ready(), node=node, name="fine", state="failed")
    replica.transition("requested", detail="requested on n1", by="ops", reason="")
    event = replica.events.get()
    assert (event.from_state, event.to_state, event.by) == ("failed", "requested", "ops")
    with pytest.raises(ApiError) as refused:
        replica.transition("present")
    assert refused.value.code == "INVALID_REPLICA_STATE"
