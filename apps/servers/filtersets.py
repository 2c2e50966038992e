import django_filters

from apps.servers.choices import ServerState
from apps.servers.models import ModelServer
from modelforge.filters import FilterSet


class ModelServerFilterSet(FilterSet):
    """One filter for the API and the dashboard list."""

    state = django_filters.ChoiceFilter(choices=ServerState.choices)
    node = django_filters.CharFilter(field_name="node__name")
    profile = django_filters.CharFilter()

    class Meta:
        model = ModelServer
        fields = ["state", "node", "profile"]
