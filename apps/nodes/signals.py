"""Signals of the nodes domain, for higher layers to react without nodes importing them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models.signals import post_delete
from django.dispatch import Signal, receiver

from apps.alerts.models import Alert
from apps.nodes import codes
from apps.nodes.models import Node
from modelforge.signals import web_worker_started

# Sent by the liveness sweep with ``nodes=[(id, name), ...]`` that just went offline, and ``event``: the id of
# the fleet's event row naming them all (its ``nodes`` column) when they went many at once, else None.
nodes_went_offline = Signal()
# Sent with ``at`` when the control plane's listening restarted (apps.nodes.listening): nodes that were
# silent only while nobody listened count as heard again from now.
listening_restarted = Signal()


@receiver(web_worker_started)
def _stamp_listening(**kwargs: Any) -> None:
    """Each web worker stamps that the control plane is listening (``apps.nodes.listening``): a gap in the
    stamps, as after a restart of every web process, restarts the nodes' grace period."""
    from apps.nodes.listening import WebTicker

    if settings.LISTENING_STAMPS:
        WebTicker().start()


@receiver(post_delete, sender=Node)
def _clear_alerts_of_a_deleted_node(sender: Any, instance: Node, **kwargs: Any) -> None:
    """A deleted node's open alerts would otherwise stay open for good: nothing can clear them."""
    Alert.objects.clear_for(
        [codes.ALERT_NODE_STALE, codes.ALERT_NODE_OFFLINE, codes.ALERT_CLUSTER_SECRET_MISMATCH],
        "node",
        str(instance.pk),
    )
