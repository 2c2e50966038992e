"""One filter per list, for the API and the dashboard alike."""

from apps.backups.models import Backup, Restore
from modelforge.filters import FilterSet


class BackupFilterSet(FilterSet):
    class Meta:
        model = Backup
        fields = ["state", "reason_code", "trigger"]


class RestoreFilterSet(FilterSet):
    class Meta:
        model = Restore
        fields = ["state", "needs_review", "backup"]
