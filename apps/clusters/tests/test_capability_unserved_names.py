"""CAPABILITY_UNSERVED names a cluster as the operator wrote it, braces and all (issue 47: a cluster named
``fz{team}`` stopped the check with ``KeyError('team')`` every few seconds, for every capability)."""

from __future__ import annotations

import pytest

from apps.alerts.models import Alert
from apps.clusters.health import check_capabilities
from apps.clusters.models import Cluster
from apps.clusters.tests.factories import bind

pytestmark = pytest.mark.django_db

NAMES = ["fz{team}", "x{", "}", "{0}", "%s", "{name}"]


def test_every_unserved_capability_is_raised_whatever_its_clusters_are_called():
    for i, name in enumerate(NAMES):
        bind(f"cap-{i}", cluster=Cluster.objects.create(name=name))
    assert check_capabilities() == [f"cap-{i}" for i in range(len(NAMES))]
    for i, name in enumerate(NAMES):
        alert = Alert.objects.open().get(code="CAPABILITY_UNSERVED", subject_name=f"cap-{i}")
        assert f"Its tiers name cluster {name}; restart" in alert.message
