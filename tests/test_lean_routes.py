"""The lean endpoints' route table (modelforge.lean.route): what each app mounts at ready(), exact paths
before prefixes, the longest prefix first, and a clash refused at start-up rather than shadowed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from modelforge import lean


@pytest.fixture
def isolated_table() -> Iterator[None]:
    saved = dict(lean._registered)
    lean._registered.clear()
    yield
    lean._registered.clear()
    lean._registered.update(saved)


async def _one(scope: dict[str, Any], receive: Any, send: Any) -> None:
    return None


async def _two(scope: dict[str, Any], receive: Any, send: Any) -> None:
    return None


def test_the_apps_mount_the_heartbeat_the_artifact_store_and_the_gateway():
    from apps.artifacts.agent_views import serve
    from apps.gateway.gateway import gateway
    from apps.nodes.fastpath import endpoint

    exact, prefixes = lean.routes()
    assert exact == {"/api/v1/agent/heartbeat": endpoint}
    assert prefixes == (("/api/v1/agent/artifacts/", serve), ("/v1/", gateway))


def test_prefixes_longest_first_and_handlers_by_import_path(isolated_table):
    lean.route(prefix="/a/", handler=_one)
    lean.route(prefix="/a/b/", handler="tests.test_lean_routes._two")
    lean.route(exact="/a/b/c", handler=_one)
    exact, prefixes = lean.routes()
    assert exact == {"/a/b/c": _one}
    assert prefixes == (("/a/b/", _two), ("/a/", _one))


def test_a_second_registration_of_the_same_handler_is_harmless_a_different_one_refused(isolated_table):
    lean.route(prefix="/a/", handler=_one)
    lean.route(prefix="/a/", handler=_one)
    with pytest.raises(ImproperlyConfigured, match="two handlers"):
        lean.route(prefix="/a/", handler=_two)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"exact": "/a", "prefix": "/b/"}, {"prefix": "/"}, {"exact": ""}, {"prefix": "v1/"}],
)
def test_a_route_names_one_path_under_the_site_root(isolated_table, kwargs):
    with pytest.raises(ImproperlyConfigured):
        lean.route(handler=_one, **kwargs)
