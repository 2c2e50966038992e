import django_filters

from apps.nodes.choices import Accelerator, Liveness
from apps.nodes.models import EnrollmentToken, Node


class NodeFilterSet(django_filters.FilterSet):
    """One filter for the API and the dashboard list."""

    liveness = django_filters.ChoiceFilter(choices=Liveness.choices)
    accelerator = django_filters.ChoiceFilter(choices=Accelerator.choices)
    enabled = django_filters.BooleanFilter()
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["liveness", "accelerator", "enabled", "name"]


class EnrollmentTokenFilterSet(django_filters.FilterSet):
    used = django_filters.BooleanFilter(field_name="used_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = EnrollmentToken
        fields = ["used"]
