"""The usage CSV export (issue 47): operator text that a spreadsheet would run as a formula is written as
text (OWASP "CSV Injection": a single quote before a cell starting with ``=``, ``+``, ``-``, ``@``, a tab
or a carriage return), through the one writer every CSV export of the project uses."""

from __future__ import annotations

import ast
import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections
from django.utils import timezone

from apps.clusters.models import ClientCredential
from apps.observability.models import UsageSample
from modelforge.csvexport import formula_safe

pytestmark = pytest.mark.django_db(databases=["default", "observability"])

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def close_the_monitoring_connection() -> Iterator[None]:
    yield
    connections["observability"].close()


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'),
        ("+1+2", "'+1+2"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("team-a", "team-a"),
        ("a=b", "a=b"),
        ("", ""),
        (-5, -5),  # a number stays a number: only text is read as a formula
        (None, None),
    ],
)
def test_only_text_that_starts_like_a_formula_is_quoted(value, written):
    assert formula_safe(value) == written


def test_the_usage_export_writes_operator_text_as_text(operator_client):
    # Regression (issue 47): a credential named "=HYPERLINK(...)" ran as a formula in the exported sheet.
    evil, _ = ClientCredential.objects.mint(name='=HYPERLINK("http://evil.example/","open")', scopes=["x@1"])
    UsageSample.objects.create(
        minute=timezone.now().replace(second=0, microsecond=0),
        credential=str(evil.pk),
        project="@team",
        capability="chat.echo@1",
        backend="-echo+1",
        requests=2,
        errors=1,
    )
    exported = operator_client.get(
        f"/api/v1/usage?days=1&group_by=credential,project,capability,backend&credential={evil.pk}&format=csv"
    )
    assert exported.status_code == 200 and exported["content-type"].startswith("text/csv")
    (row,) = list(csv.DictReader(io.StringIO(exported.content.decode())))
    assert row["credential_name"] == '\'=HYPERLINK("http://evil.example/","open")'
    assert (row["project"], row["backend"], row["capability"]) == ("'@team", "'-echo+1", "chat.echo@1")
    assert (row["requests"], row["errors"]) == ("2", "1")
    # The JSON answer is data, not a sheet: it keeps the text as it is.
    answer = operator_client.get(f"/api/v1/usage?days=1&credential={evil.pk}").json()
    assert answer["rows"][0]["credential_name"] == '=HYPERLINK("http://evil.example/","open")'


def test_every_csv_export_writes_through_the_formula_safe_writer():
    """A new export that builds its own ``csv.writer`` would not escape: only modelforge/csvexport.py may."""
    direct = []
    for package in ("apps", "modelforge"):
        for path in (ROOT / package).rglob("*.py"):
            if "tests" in path.parts or path == ROOT / "modelforge" / "csvexport.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "csv"
                    and node.attr in ("writer", "DictWriter")
                ):
                    direct.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert direct == []
