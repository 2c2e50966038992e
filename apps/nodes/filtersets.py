import django_filters

from apps.nodes.choices import Accelerator, Liveness
from apps.nodes.models import EnrollmentToken, Node, NodeQuerySet
from modelforge.filters import BooleanFilter, FilterSet


class NodeFilterSet(FilterSet):
    """One filter for the API and the dashboard list."""

    # As it is now: the fleet's stale state included (models.liveness_now).
    liveness = django_filters.ChoiceFilter(choices=Liveness.choices, method="filter_liveness")
    accelerator = django_filters.ChoiceFilter(choices=Accelerator.choices)
    enabled = BooleanFilter()
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["liveness", "accelerator", "enabled", "name"]

    def filter_liveness(self, queryset: NodeQuerySet, name: str, value: str) -> NodeQuerySet:
        return queryset.in_liveness(value)


class EnrollmentTokenFilterSet(FilterSet):
    used = BooleanFilter(field_name="used_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = EnrollmentToken
        fields = ["used"]
