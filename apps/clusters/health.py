"""``CAPABILITY_UNSERVED``: a capability bound to routing tiers with no backend the gateway could use.

Read from the same bindings the gateway routes with (``bindings.read_bindings``), so the alert says exactly
what clients see: 503 for every request to it. Cleared when a backend runs again or the capability
loses its tiers.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from apps.clusters import codes
from apps.clusters.bindings import read_bindings
from apps.clusters.models import Capability


def check_capabilities(now: datetime | None = None) -> list[str]:
    """Raise for every unserved capability, clear the rest; returns the unserved capabilities' names."""
    now = now or timezone.now()
    bindings, _follows = read_bindings()
    ids = dict(Capability.objects.values_list("name", "pk"))
    unserved = sorted(name for name, tiers in bindings.items() if not any(b.backends for b in tiers))
    for name in unserved:
        tiers = bindings[name]
        what = ", ".join(
            sorted({f"cluster {b.cluster}" if b.cluster else "a standalone server" for b in tiers})
        )
        Alert.objects.raise_alert(
            codes.ALERT_CAPABILITY_UNSERVED,
            Severity.CRITICAL,
            "capability",
            str(ids.get(name, name)),
            name,
            f"Capability {name} has no running backend: every request to it is answered 503. Its tiers name "
            f"{what}; restart or re-place their failed servers (Model servers), or bind it elsewhere.",
            at=now,
        )
    keep = {str(ids.get(name, name)) for name in unserved}
    stale = (
        Alert.objects.open()
        .filter(code=codes.ALERT_CAPABILITY_UNSERVED)
        .exclude(subject_id__in=keep)
        .values_list("dedup_key", flat=True)
    )
    Alert.objects.clear(list(stale), at=now)
    return unserved
