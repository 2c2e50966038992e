"""Client credentials from the dashboard: minted with exact scopes and shown once, revoked with a button."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.clusters.models import Capability, ClientCredential, digest

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    Capability.objects.create(name="rag.embedding@1")
    Capability.objects.create(name="chat.general@1")
    return client


def test_a_credential_is_minted_shown_once_and_stored_hashed(operator):
    response = operator.post(
        "/clusters/credentials/mint",
        {"name": "search-app", "scopes": ["rag.embedding@1"], "project": "search", "expires_in_days": "30"},
    )
    assert response.status_code == 302
    page = operator.get("/clusters/").content.decode()
    credential = ClientCredential.objects.get(name="search-app")
    plain = page.split("<p><code>")[1].split("</code>")[0]
    assert plain.startswith("mfc_") and digest(plain) == credential.secret_hash
    assert credential.scopes == ["rag.embedding@1"] and credential.project == "search"
    assert credential.expires_at is not None
    # Shown once: the next view no longer has it.
    assert plain not in operator.get("/clusters/").content.decode()


@pytest.mark.parametrize(
    ("form", "why"),
    [
        ({"name": "x", "scopes": ["rag.embedding@1 "]}, "scopes"),
        ({"name": "x", "scopes": ["RAG.embedding@1"]}, "scopes"),
        ({"name": "x", "scopes": []}, "scopes"),
        ({"name": "", "scopes": ["rag.embedding@1"]}, "name"),
        ({"name": "x", "scopes": ["rag.embedding@1"], "expires_in_days": "soon"}, "expires"),
    ],
)
def test_a_bad_form_mints_nothing_and_says_why(operator, form, why):
    page = operator.post("/clusters/credentials/mint", form, follow=True).content.decode()
    assert "VALIDATION_ERROR" in page and why in page
    assert not ClientCredential.objects.exists()


def test_a_credential_is_revoked_from_the_dashboard(operator):
    credential, _ = ClientCredential.objects.mint(name="old-app", scopes=["chat.general@1"])
    page = operator.post(f"/clusters/credentials/{credential.pk}/revoke", follow=True).content.decode()
    credential.refresh_from_db()
    assert credential.revoked_at is not None and "revoked" in page
