"""One filter per list, for the API and the dashboard alike."""

from apps.embedding_migrations.models import Cutover
from modelforge.filters import FilterSet


class CutoverFilterSet(FilterSet):
    class Meta:
        model = Cutover
        fields = ["stage", "alias"]
