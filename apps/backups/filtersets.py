"""One filter per list, for the API and the dashboard alike."""

import django_filters

from apps.backups.models import Backup, Restore


class BackupFilterSet(django_filters.FilterSet):
    class Meta:
        model = Backup
        fields = ["state", "reason_code", "trigger"]


class RestoreFilterSet(django_filters.FilterSet):
    class Meta:
        model = Restore
        fields = ["state", "needs_review", "backup"]
