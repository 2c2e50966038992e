"""The import layering as a check over the source tree (tests/test_layering.py runs it).

Lower layers never import higher ones, not even lazily inside a function:

    modelforge < apps.core < alerts < nodes < artifacts < servers < clusters
        < embedding_migrations < gateway < observability < backups

1. Every ``.py`` file under ``apps/``, ``modelforge/`` and ``agent/`` is parsed with ``ast`` (``tests/``
   and ``migrations/`` directories are skipped: tests may reach anywhere, migrations are frozen history).
2. Every import is collected wherever it sits: module level, inside a function, under ``TYPE_CHECKING``;
   relative imports are resolved against the file's package. Imports spelt as strings count too where
   they are obvious: ``importlib.import_module("...")``/``__import__("...")``, ``apps.get_model("label",
   ...)`` and relation fields naming a model as ``"label.Model"``.
3. Each import is judged by the rules below; raw SQL in a string (a table named after ``FROM``, ``JOIN``,
   ``UPDATE``, ``INTO`` or ``TABLE``) is judged as an import of the app owning the table (Django's default
   ``<label>_<model>`` table names).

Rules, as they are named in a breach:

- ``layer-order``: an app imports an app above it in ``LAYERS``.
- ``core-knows-no-domain``: ``apps.core`` imports (or reads the tables of) any domain app.
- ``kernel-imports-no-app``: ``modelforge`` imports any ``apps.*`` module.
- ``agent-stands-alone``: ``agent`` imports Django (or DRF), ``apps.*`` or ``modelforge``.
- ``app-not-layered``: a module lives in, or imports, an ``apps.<name>`` missing from ``LAYERS``.

The root URLconf's ``include("apps.x.urls")`` and settings' ``INSTALLED_APPS`` name apps as configuration,
not as imports, and are not judged."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[str, ...] = (
    "modelforge",
    "apps.core",
    "apps.alerts",
    "apps.nodes",
    "apps.artifacts",
    "apps.servers",
    "apps.clusters",
    "apps.embedding_migrations",
    "apps.gateway",
    "apps.observability",
    "apps.backups",
)
DOMAIN_APPS = frozenset(LAYERS[2:])
PACKAGES = ("apps", "modelforge", "agent")
SKIPPED_DIRECTORIES = frozenset({"tests", "migrations", "__pycache__"})
# What the agent may never import: Django itself and what cannot be imported without it.
AGENT_FORBIDDEN = ("django", "rest_framework", "drf_spectacular", "apps", "modelforge")
RELATION_FIELDS = frozenset({"ForeignKey", "OneToOneField", "ManyToManyField"})
DYNAMIC_IMPORTS = frozenset({"import_module", "__import__"})
SQL_TABLE = re.compile(r"\b(?:FROM|JOIN|UPDATE|INTO|TABLE)\s+\"?([a-z][a-z0-9_]*)", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Breach:
    """One import (or SQL string) that runs the wrong way, with where it is and which rule it breaks."""

    path: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.detail}"


def labels() -> dict[str, str]:
    """Django app label -> app package, for every layered app (the label is the package's last part)."""
    return {app.rsplit(".", 1)[1]: app for app in LAYERS if app.startswith("apps.")}


def owner(target: str) -> str:
    """The layer (or top-level package) a dotted module name belongs to: ``apps.nodes.models`` ->
    ``apps.nodes``, ``modelforge.errors`` -> ``modelforge``, ``django.db`` -> ``django``."""
    parts = target.split(".")
    if parts[0] == "apps" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    """The dotted module name of a file under ``root``, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def source_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> Iterator[Path]:
    for package in packages:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if SKIPPED_DIRECTORIES.isdisjoint(path.relative_to(root).parts[:-1]):
                yield path


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, *([name] if name else [])])


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes (prose, not SQL)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and _string(body[0].value) is not None:
                found.add(id(body[0].value))
    return found


def imports_in(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str, str]]:
    """``(line, imported module, how)`` for every import in the tree, wherever it sits."""
    label_map = labels()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, "import"
        elif isinstance(node, ast.ImportFrom):
            base = (
                _resolve_relative(module, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            names = [alias.name for alias in node.names]
            if base in PACKAGES or not base:
                # ``from apps import nodes`` imports apps.nodes itself.
                for name in names:
                    yield node.lineno, f"{base}.{name}".lstrip("."), "import"
            else:
                yield node.lineno, base, f"import {base} ({', '.join(names)})"
        elif isinstance(node, ast.Call):
            called = _called_name(node)
            first = _string(node.args[0]) if node.args else None
            if called in DYNAMIC_IMPORTS and first and not first.startswith("."):
                yield node.lineno, first, f"{called}({first!r})"
            elif called == "get_model" and first:
                label = first.split(".", 1)[0]
                if label in label_map:
                    yield node.lineno, label_map[label], f"get_model({first!r})"
            elif called in RELATION_FIELDS:
                to = first or next((_string(k.value) for k in node.keywords if k.arg == "to"), None)
                if to and "." in to and to.split(".", 1)[0] in label_map:
                    yield node.lineno, label_map[to.split(".", 1)[0]], f"{called}({to!r})"


def tables_in(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """``(line, app package, table)`` for every table of a layered app named in SQL in a string."""
    label_map = labels()
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        text = _string(node)
        if text is None or id(node) in docstrings or not isinstance(node, ast.expr):
            continue
        for match in SQL_TABLE.finditer(text):
            table = match.group(1).lower()
            for label, app in label_map.items():
                if table.startswith(label + "_"):
                    yield node.lineno, app, table


def judge(source: str, target: str) -> str | None:
    """The rule an import of ``target`` from the layer ``source`` breaks, or None."""
    to = owner(target)
    if source == "agent":
        return "agent-stands-alone" if to in AGENT_FORBIDDEN else None
    if source == "modelforge":
        return "kernel-imports-no-app" if to.startswith("apps.") else None
    if not source.startswith("apps."):
        return None
    if not to.startswith("apps."):
        return None
    if to not in LAYERS:
        return "app-not-layered"
    if source not in LAYERS or to == source:
        return None
    if source == "apps.core":
        return "core-knows-no-domain" if to in DOMAIN_APPS else None
    return "layer-order" if LAYERS.index(to) > LAYERS.index(source) else None


def check_file(root: Path, path: Path) -> list[Breach]:
    module, is_package = module_name(root, path)
    source = owner(module)
    shown = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=shown)
    breaches = []
    if module == source and source.startswith("apps.") and source not in LAYERS:  # once, at its __init__
        breaches.append(Breach(shown, 1, "app-not-layered", f"{source} has no place in LAYERS"))
    for line, target, how in imports_in(tree, module, is_package):
        rule = judge(source, target)
        if rule:
            what = target if how == "import" else how.removeprefix("import ")
            breaches.append(Breach(shown, line, rule, f"{source} imports {what}"))
    for line, app, table in tables_in(tree):
        rule = judge(source, app)
        if rule:
            breaches.append(Breach(shown, line, rule, f"{source} raw SQL names {table} ({app})"))
    return breaches


def check_tree(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Breach]:
    """Every breach of the layering under ``root``, sorted by file and line."""
    return sorted({b for path in source_files(root, packages) for b in check_file(root, path)})


def report(breaches: list[Breach]) -> str:
    lines = [f"{len(breaches)} import(s) run against the layering ({' < '.join(LAYERS)}):"]
    lines += [f"  {breach}" for breach in breaches]
    return "\n".join(lines)
