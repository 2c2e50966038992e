import django_filters

from apps.alerts.choices import Severity
from apps.alerts.models import Alert
from modelforge.filters import BooleanFilter, FilterSet


class AlertFilterSet(FilterSet):
    """One filter for the API and the dashboard list."""

    code = django_filters.CharFilter()
    severity = django_filters.ChoiceFilter(choices=Severity.choices)
    subject_type = django_filters.CharFilter()
    subject_id = django_filters.CharFilter()
    open = BooleanFilter(field_name="cleared_at", lookup_expr="isnull", label="Open")

    class Meta:
        model = Alert
        fields = ["code", "severity", "subject_type", "subject_id", "open"]
