"""Lower layers never import higher ones (docs/DECISIONS.md, issue 15): the whole tree, and the checker
itself on a small fake tree so that it cannot pass by finding nothing."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from tests import layering

ROOT = Path(__file__).resolve().parent.parent


def test_no_module_imports_against_the_layering():
    breaches = layering.check_tree(ROOT)
    if breaches:
        pytest.fail(layering.report(breaches), pytrace=False)


def test_every_app_has_a_place_in_the_layers():
    apps = {f"apps.{path.parent.name}" for path in (ROOT / "apps").glob("*/apps.py")}
    assert apps - set(layering.LAYERS) == set(), "add the new app to tests/layering.py LAYERS"


def test_the_walk_reads_every_package_and_skips_tests_and_migrations():
    files = [path.relative_to(ROOT).as_posix() for path in layering.source_files(ROOT)]
    assert {"modelforge/asgi.py", "agent/heartbeat.py", "apps/nodes/models.py"} <= set(files)
    assert not [f for f in files if "/tests/" in f or "/migrations/" in f]


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text))
    return root


FAKE_TREE = {
    "apps/__init__.py": "",
    "apps/core/__init__.py": "",
    "apps/core/views.py": """\
        from apps.nodes.models import Node
        SQL = "SELECT count(*) FROM servers_modelserver s JOIN core_installation i ON true"


        def doc():
            '''Reads FROM nodes_node in prose only: a docstring is not SQL.'''
        """,
    "apps/nodes/__init__.py": "",
    "apps/nodes/models.py": """\
        from django.db import models

        from apps.core import views
        from . import liveness


        class Node(models.Model):
            server = models.ForeignKey("servers.ModelServer", on_delete=models.CASCADE)
        """,
    "apps/nodes/liveness.py": """\
        def sweep():
            from ..servers.models import ModelServer
            from apps import alerts
        """,
    "apps/nodes/tests/test_x.py": "from apps.backups import models\n",
    "apps/nodes/migrations/0001_initial.py": "from apps.backups import models\n",
    "apps/servers/__init__.py": "",
    "apps/servers/usage.py": """\
        import importlib

        from apps.nodes.models import Node


        def lazily():
            importlib.import_module("apps.clusters.models")
            return apps.get_model("backups", "Backup")
        """,
    "apps/newapp/__init__.py": "",
    "apps/newapp/models.py": "from apps.core import views\n",
    "apps/clusters/__init__.py": "from apps.newapp import models\n",
    "modelforge/__init__.py": "",
    "modelforge/metrics.py": """\
        from typing import TYPE_CHECKING

        from modelforge import errors

        if TYPE_CHECKING:
            from apps.core.models import Installation


        def view():
            __import__("apps.nodes.models")
        """,
    "agent/__init__.py": "",
    "agent/client.py": """\
        import json

        import django.conf
        from agent import protocol


        def send():
            from modelforge.config import read
            from rest_framework import status
        """,
}


def test_the_checker_names_each_breach_with_its_file_line_and_rule(tmp_path):
    breaches = layering.check_tree(write(tmp_path, FAKE_TREE))
    found = {(b.path, b.line, b.rule) for b in breaches}
    assert found == {
        ("apps/core/views.py", 1, "core-knows-no-domain"),
        ("apps/core/views.py", 2, "core-knows-no-domain"),  # raw SQL naming servers_modelserver
        ("apps/nodes/models.py", 8, "layer-order"),  # ForeignKey("servers.ModelServer")
        ("apps/nodes/liveness.py", 2, "layer-order"),  # relative, inside a function
        ("apps/servers/usage.py", 7, "layer-order"),  # importlib.import_module("apps.clusters.models")
        ("apps/servers/usage.py", 8, "layer-order"),  # apps.get_model("backups", ...)
        ("apps/newapp/__init__.py", 1, "app-not-layered"),  # the app itself, once
        ("apps/clusters/__init__.py", 1, "app-not-layered"),
        ("modelforge/metrics.py", 6, "kernel-imports-no-app"),  # under TYPE_CHECKING still couples
        ("modelforge/metrics.py", 10, "kernel-imports-no-app"),  # __import__("apps.nodes.models")
        ("agent/client.py", 3, "agent-stands-alone"),
        ("agent/client.py", 8, "agent-stands-alone"),
        ("agent/client.py", 9, "agent-stands-alone"),
    }
    lines = layering.report(breaches).splitlines()
    assert lines[0].startswith("13 import(s) run against the layering")
    expected = "apps/nodes/liveness.py:2: [layer-order] apps.nodes imports apps.servers.models (ModelServer)"
    assert f"  {expected}" in lines


def test_the_checker_passes_a_tree_that_keeps_the_order(tmp_path):
    tree = write(
        tmp_path,
        {
            "apps/core/models.py": "from modelforge.errors import ApiError\n",
            "apps/alerts/models.py": "from apps.core.models import Installation\n",
            "apps/backups/snapshot.py": "from apps.nodes.models import Node\nfrom apps.gateway import lb\n",
            "apps/gateway/routing.py": "from apps.embedding_migrations.models import EmbeddingSpace\n",
            "modelforge/settings.py": "import environ\nfrom modelforge import config\n",
            "agent/heartbeat.py": "import json\nfrom agent.settings import read\nfrom . import protocol\n",
        },
    )
    assert layering.check_tree(tree) == []
