"""One filter per list, for the API and the dashboard alike."""

import django_filters

from apps.embedding_migrations.models import Cutover


class CutoverFilterSet(django_filters.FilterSet):
    class Meta:
        model = Cutover
        fields = ["stage", "alias"]
