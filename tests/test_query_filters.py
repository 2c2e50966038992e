"""A list's query filter with a value it cannot read is refused, never dropped.

A filter that quietly ignored ``?enabled=flase`` answered with every row: an operator's script that
disables what ``GET /nodes?enabled=true`` returns would act on the whole fleet after one typo. Every
boolean and integer query parameter of the API is checked here against the OpenAPI document, so a
list added later is held to the same rule; the dashboard's lists say what they refused and list
nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from drf_spectacular.generators import SchemaGenerator

from apps.nodes.tests.factories import beat, make_node

pytestmark = pytest.mark.django_db

PAGINATION = {"limit", "offset"}  # modelforge.pagination refuses these itself (tests/test_api_fuzz.py)


def _query_parameters(kind: str) -> list[tuple[str, str]]:
    schema: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    found = []
    for path, operations in schema["paths"].items():
        operation = operations.get("get")
        if operation is None or "{" in path:
            continue
        for parameter in operation.get("parameters", []):
            if parameter.get("in") != "query" or parameter["name"] in PAGINATION:
                continue
            if parameter["schema"].get("type") == kind:
                found.append((path, parameter["name"]))
    return found


BOOLEANS = _query_parameters("boolean")
INTEGERS = _query_parameters("integer")


def test_the_schema_names_the_filters_this_file_checks():
    # Fails if the schema stops describing them (the parametrised tests below would then check nothing).
    assert ("/api/v1/nodes", "enabled") in BOOLEANS
    assert ("/api/v1/alerts", "open") in BOOLEANS
    assert ("/api/v1/restores", "needs_review") in BOOLEANS
    assert ("/api/v1/embedding-spaces", "dimension") in INTEGERS


UNREADABLE = [
    (path, name, value) for path, name in BOOLEANS for value in ("maybe", "-58800", "yes please")
] + [(path, name, value) for path, name in INTEGERS for value in ("0.5", "ten")]


@pytest.mark.parametrize(("path", "name", "value"), UNREADABLE)
def test_a_filter_refuses_a_value_it_cannot_read(operator_client, path, name, value):
    """A boolean filter takes true/false or 1/0; an integer column's filter a whole number."""
    response = operator_client.get(path, {name: value})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "VALIDATION_ERROR"
    assert name in body["message"]


@pytest.fixture
def two_nodes():
    _, on = make_node(name="on-a")
    make_node(name="off-b", enabled=False)
    beat(on)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("true", ["on-a"]),
        ("True", ["on-a"]),
        ("1", ["on-a"]),
        ("false", ["off-b"]),
        ("FALSE", ["off-b"]),
        ("0", ["off-b"]),
        ("", ["off-b", "on-a"]),  # empty is the same as leaving the parameter out
    ],
)
def test_a_boolean_filter_reads_the_usual_spellings(operator_client, two_nodes, value, names):
    response = operator_client.get("/api/v1/nodes", {"enabled": value})
    assert response.status_code == 200
    assert sorted(n["name"] for n in response.json()["results"]) == names


def test_the_dashboard_says_which_filter_it_could_not_read_and_lists_nothing(client, two_nodes):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    refused = client.get("/nodes/", {"enabled": "flase"})
    assert refused.status_code == 200
    text = refused.content.decode()
    assert 'id="filter-errors"' in text and "enabled" in text
    assert "on-a" not in text and "off-b" not in text
    assert "on-a" in client.get("/nodes/", {"enabled": "true"}).content.decode()
    alerts = client.get("/alerts/", {"open": "perhaps"}).content.decode()
    assert 'id="filter-errors"' in alerts and "open" in alerts


@pytest.mark.parametrize(
    ("path", "query", "empty_state"),
    [
        ("/nodes/", {"enabled": "flase"}, "Enroll one"),
        ("/servers/", {"state": "rnning"}, "Place one"),
        ("/artifacts/", {"state": "redy"}, "No artifacts"),
        ("/backups/", {"state": "verifed"}, "No backups yet"),
        ("/alerts/", {"open": "perhaps"}, "alerts."),
        ("/migrations/", {"stage": "doen"}, "No cutovers"),
    ],
)
def test_a_refused_filter_s_empty_list_points_at_the_refusal_not_at_an_empty_fleet(
    client, path, query, empty_state
):
    # The list is empty because nothing was listed, not because nothing exists: its empty row must not
    # tell the operator to enroll a node or place a server they already have.
    client.force_login(User.objects.create_user("ops", is_staff=True))
    text = client.get(path, query).content.decode()
    assert 'id="filter-errors"' in text
    assert empty_state not in text
    assert "Nothing listed: a filter's value above could not be read." in text
    plain = client.get(path).content.decode()
    assert 'id="filter-errors"' not in plain and empty_state in plain
