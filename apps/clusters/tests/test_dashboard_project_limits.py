"""Projects' default limits from the dashboard: listed, set, changed and removed through the same
serializer as ``/api/v1/project-limits``, refused with the same named errors; reached from the navigation,
the Clusters page and each credential's page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.clusters.models import ClientCredential, ProjectLimits

pytestmark = pytest.mark.django_db

URL = "/clusters/project-limits/"
EMPTY = {
    "requests_per_minute": "",
    "tokens_per_minute": "",
    "max_concurrent": "",
    "tokens_per_day": "",
    "tokens_per_month": "",
}


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


def test_the_page_lists_each_projects_defaults_and_is_in_the_navigation(operator):
    ProjectLimits.objects.create(project="shop", requests_per_minute=3, tokens_per_day=500)
    ClientCredential.objects.mint(name="web", scopes=["chat.echo@1"], project="shop")
    ClientCredential.objects.mint(name="batch", scopes=["chat.echo@1"], project="reports")
    page = operator.get(URL).content.decode()
    row = page.split('id="defaults-')[1].split("</tr>")[0]
    assert ">shop</a>" in row and "<td>3</td>" in row and "<td>500</td>" in row and "<td>—</td>" in row
    assert "<td>1</td>" in row  # one credential of the project
    # A project that credentials name without defaults: a link to a prefilled form.
    without = page.split('id="projects-without-defaults">')[1].split("</ul>")[0]
    assert "<code>reports</code>" in without and "?project=reports" in without
    assert 'value="reports"' in operator.get(URL + "?project=reports").content.decode()
    assert f'href="{URL}" aria-current="page">Project limits</a>' in page
    assert 'id="project-limits-link"' in operator.get("/clusters/").content.decode()


def test_defaults_are_set_changed_and_removed(operator):
    answer = operator.post(
        URL + "create", {"project": "shop", **EMPTY, "requests_per_minute": "3"}, follow=True
    )
    assert "Default limits of project shop saved" in answer.content.decode()
    saved = ProjectLimits.objects.get(project="shop")
    assert saved.requests_per_minute == 3 and saved.max_concurrent is None
    page = operator.get(f"{URL}{saved.pk}/").content.decode()
    assert 'id="requests_per_minute" value="3"' in page
    changed = {"project": "shop", **EMPTY, "max_concurrent": "2", "tokens_per_month": "1000000"}
    operator.post(f"{URL}{saved.pk}/edit", changed, follow=True)
    saved.refresh_from_db()
    # Empty is "no default", as the API's null: the 3 a minute is gone.
    assert (saved.requests_per_minute, saved.max_concurrent, saved.tokens_per_month) == (None, 2, 10**6)
    gone = operator.post(f"{URL}{saved.pk}/delete", follow=True).content.decode()
    assert "Default limits of project shop removed" in gone
    assert not ProjectLimits.objects.exists()


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"project": "shop", "requests_per_minute": "0"}, "requests_per_minute"),
        ({"project": "shop", "max_concurrent": "-1"}, "max_concurrent"),
        ({"project": "shop", "requests_per_minute": str(2**31)}, "requests_per_minute"),
        ({"project": "shop", "tokens_per_day": str(2**63)}, "tokens_per_day"),
        ({"project": "shop", "tokens_per_minute": "many"}, "tokens_per_minute"),
        ({"project": ""}, "project"),
        ({"project": " shop"}, "project"),
        ({"project": "x" * 64}, "project"),
    ],
)
def test_bad_defaults_are_refused_by_name_as_the_api_refuses_them(operator, operator_client, form, field):
    page = operator.post(URL + "create", {**EMPTY, **form}, follow=True).content.decode()
    assert f"VALIDATION_ERROR: {field}:" in page
    assert not ProjectLimits.objects.exists()
    # The API says the same of the same body (its serializer is the one the form goes through).
    body = {k: v for k, v in {**EMPTY, **form}.items() if v != ""}
    api = operator_client.post("/api/v1/project-limits", body, format="json").json()
    assert api["code"] == "VALIDATION_ERROR" and f"{field}:" in api["message"]


def test_a_project_has_one_set_of_defaults_and_a_bad_change_keeps_the_old(operator):
    kept = ProjectLimits.objects.create(project="shop", requests_per_minute=3)
    other = ProjectLimits.objects.create(project="reports")
    page = operator.post(URL + "create", {"project": "shop", **EMPTY}, follow=True).content.decode()
    assert "VALIDATION_ERROR: project: This project has default limits already" in page
    # A failed create comes back to the form with the project filled in.
    assert 'id="project" required maxlength="63" value="shop"' in page
    renamed = {"project": "shop", **EMPTY}
    page = operator.post(f"{URL}{other.pk}/edit", renamed, follow=True).content.decode()
    assert "VALIDATION_ERROR: project:" in page
    broken = {"project": "shop", **EMPTY, "requests_per_minute": "0"}
    operator.post(f"{URL}{kept.pk}/edit", broken)
    kept.refresh_from_db()
    assert kept.requests_per_minute == 3 and ProjectLimits.objects.count() == 2


def test_the_credential_page_links_to_its_projects_defaults(operator):
    credential, _ = ClientCredential.objects.mint(name="web", scopes=["chat.echo@1"], project="shop")
    page = operator.get(f"/clusters/credentials/{credential.pk}/").content.decode()
    assert f'href="{URL}?project=shop" id="project-defaults">set them</a>' in page
    defaults = ProjectLimits.objects.create(project="shop", max_concurrent=2)
    page = operator.get(f"/clusters/credentials/{credential.pk}/").content.decode()
    assert f'href="{URL}{defaults.pk}/" id="project-defaults">its default limits</a>' in page
    detail = operator.get(f"{URL}{defaults.pk}/").content.decode()
    assert f'href="/clusters/credentials/{credential.pk}/">web</a>' in detail


def test_the_pages_are_for_operators(client):
    ProjectLimits.objects.create(project="shop")
    assert client.get(URL).status_code == 302
    assert client.post(URL + "create", {"project": "x"}).status_code == 302
    client.force_login(User.objects.create_user("viewer"))  # not staff
    assert client.get(URL).status_code == 302
    assert client.post(URL + "create", {"project": "x"}).status_code == 302
    assert ProjectLimits.objects.count() == 1
