"""One filter per list, for the API and the dashboard alike."""

import django_filters

from apps.artifacts.models import Artifact, Replica


class ArtifactFilterSet(django_filters.FilterSet):
    class Meta:
        model = Artifact
        fields = ["state", "source_kind"]


class ReplicaFilterSet(django_filters.FilterSet):
    class Meta:
        model = Replica
        fields = ["state", "node", "artifact"]
