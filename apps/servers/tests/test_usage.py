"""What uses a server is asked of the apps above servers through a registry (servers imports none)."""

from __future__ import annotations

from apps.clusters.usage import server_usage
from apps.servers import usage
from apps.servers.models import ModelServer
from apps.servers.usage import CapabilityUse, UsedBy, register_usage, used_by


def test_clusters_registered_its_source_at_ready():
    assert server_usage in usage._sources


def test_used_by_joins_every_source_in_order_and_a_second_registration_is_a_no_op(monkeypatch):
    monkeypatch.setattr(usage, "_sources", [])
    server = ModelServer(name="s")
    assert used_by(server) == {"clusters": [], "capabilities": []}

    def first(_: ModelServer) -> UsedBy:
        return {"clusters": [{"id": 1, "name": "c", "member": "m"}], "capabilities": []}

    def second(_: ModelServer) -> UsedBy:
        cap: CapabilityUse = {"id": 2, "name": "x.y@1", "tier": 0, "via": "server", "cluster": None}
        return {"clusters": [], "capabilities": [cap]}

    for source in (first, second, first):
        register_usage(source)
    assert usage._sources == [first, second]
    assert used_by(server) == {
        "clusters": [{"id": 1, "name": "c", "member": "m"}],
        "capabilities": [{"id": 2, "name": "x.y@1", "tier": 0, "via": "server", "cluster": None}],
    }


def test_servers_imports_no_app_above_it():
    # Regression: usage.py imported apps.clusters.models inside used_by (servers sits below clusters).
    import inspect

    assert "apps.clusters" not in inspect.getsource(usage)
