"""One filter per list, for the API and the dashboard alike."""

from apps.artifacts.models import Artifact, Replica
from modelforge.filters import FilterSet


class ArtifactFilterSet(FilterSet):
    class Meta:
        model = Artifact
        fields = ["state", "source_kind"]


class ReplicaFilterSet(FilterSet):
    class Meta:
        model = Replica
        fields = ["state", "node", "artifact"]
