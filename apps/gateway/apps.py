from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import AppConfig

if TYPE_CHECKING:
    from apps.clusters.models import Cluster


class GatewayConfig(AppConfig):
    """The serving data path: ``/v1/*`` routed by the clusters app's configuration (apps/clusters), the
    routing table each process caches, the load balancer's shared state, the upstream client."""

    name = "apps.gateway"
    label = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from apps.clusters import loadbalancer as card
        from apps.clusters.models import ClusterMember
        from apps.gateway import (
            checks,  # noqa: F401 -- registers the configuration check (gateway.E001)
            contributions,
            routing,
        )
        from apps.nodes.signals import listening_restarted
        from apps.servers.signals import server_state_changed
        from modelforge import lean
        from modelforge.signals import web_worker_started

        # The routing-table invalidation: a change to what the table is built from moves the version.
        post_save.connect(routing.routing_changed, dispatch_uid="gateway.routing_changed.save")
        post_delete.connect(routing.routing_changed, dispatch_uid="gateway.routing_changed.delete")
        server_state_changed.connect(routing.server_state_changed, dispatch_uid="gateway.server_state")
        # A cluster's membership changed: its load-balancer card's shares start again from now.
        post_save.connect(_shape_changed, sender=ClusterMember, dispatch_uid="gateway.shape.save")
        post_delete.connect(_shape_changed, sender=ClusterMember, dispatch_uid="gateway.shape.delete")
        # Listening restarted after the control plane itself was away: a rebuild. (Routing no longer reads
        # node liveness since issue 48; kept as a cheap notice for what the table may have missed.)
        listening_restarted.connect(routing.server_state_changed, dispatch_uid="gateway.listening")
        # Each web worker's routing refresher, started before it serves: its first request finds a table.
        web_worker_started.connect(_start_refresher, dispatch_uid="gateway.refresher")
        contributions.register()  # the load balancer's gauges on /metrics
        card.register_report(_card)  # the clusters dashboard's and API's load-balancer card
        card.register_queue_depths(_queue_depths)  # the capabilities' admission queues, for the dashboard
        # OpenAI-compatible /v1/*, beside Django (apps/gateway/gateway.py).
        lean.route(prefix="/v1/", handler="apps.gateway.gateway.gateway")


def _start_refresher(**kwargs: Any) -> None:
    from apps.gateway.routing import router

    router.start()


def _shape_changed(instance: Any, **kwargs: Any) -> None:
    from apps.gateway.lbstate import shape_changed  # (imported on first use: see _card)

    shape_changed(instance.cluster_id)


def _queue_depths() -> dict[str, int] | None:
    from apps.gateway.lbstate import read_queue_depths  # (imported on first use: see _card)

    return read_queue_depths()


def _card(cluster: Cluster) -> dict[str, Any]:
    # Imported on first use, not at ready(): the load balancer's state (apps/gateway/lbstate.py) names
    # its process at import, and gunicorn's master runs ready() before it forks the web workers.
    from apps.gateway.loadbalancer import cluster_report

    return cluster_report(cluster)
