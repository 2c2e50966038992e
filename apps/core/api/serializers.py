from datetime import datetime

from rest_framework import serializers

from apps.core import work


class ProbeSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    detail = serializers.CharField()


class SystemStatusSerializer(serializers.Serializer):
    release = serializers.CharField()
    environment = serializers.CharField()
    database = ProbeSerializer()
    broker = ProbeSerializer()
    installation_id = serializers.UUIDField(allow_null=True)
    worker_seen_at = serializers.DateTimeField(allow_null=True)
    worker_seen_hostname = serializers.CharField(allow_blank=True)
    beat_seen_at = serializers.DateTimeField(allow_null=True)
    beat_seen_hostname = serializers.CharField(allow_blank=True)


class InvariantSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    violations = serializers.IntegerField(help_text="Rows that break it; 0 when it holds.")


class InvariantsSerializer(serializers.Serializer):
    """``apps.core.invariants.check_live``: sound when no invariant has a violation."""

    sound = serializers.BooleanField()
    checked_at = serializers.DateTimeField()
    invariants = InvariantSerializer(many=True)


class WorkerProbeSerializer(serializers.Serializer):
    task_id = serializers.CharField()
    status_url = serializers.CharField()


class WorkSerializer(serializers.Serializer):
    """A row waiting on background work (``apps.core.work.Waiting.as_dict``)."""

    kind = serializers.CharField(help_text=f"One of {', '.join(work.KINDS)}.")
    id = serializers.CharField()
    name = serializers.CharField()
    state = serializers.CharField()
    waits_on = serializers.CharField(help_text="What the row waits for: a worker, its agent, its copy.")
    since = serializers.DateTimeField(help_text="When it began to wait (its state's event, or its request).")
    age_seconds = serializers.FloatField()
    stuck_after_seconds = serializers.IntegerField(help_text="Its bound: past it, WORK_STUCK names it.")
    stuck = serializers.BooleanField()


class WorkFailedSerializer(serializers.Serializer):
    """A row an operator marked failed: what it was, and who."""

    kind = serializers.CharField(help_text=f"One of {', '.join(work.KINDS)}.")
    id = serializers.CharField()
    name = serializers.CharField()
    was = serializers.CharField(help_text="The state it waited in.")
    state = serializers.CharField(help_text="Always failed.")
    by = serializers.CharField()


class WorkFilterSerializer(serializers.Serializer):
    """``?kind=`` and ``?stuck=``, for the API list and the dashboard's Work page alike. Give it a plain
    dict (``QueryDict.dict()``): from form data DRF would read an absent boolean as false."""

    kind = serializers.ChoiceField(choices=list(work.KINDS), required=False)
    stuck = serializers.BooleanField(required=False)

    def rows(self, now: datetime) -> list[work.Waiting]:
        kind, stuck = self.validated_data.get("kind"), self.validated_data.get("stuck")
        rows = [item for item in work.waiting(now) if not kind or item.kind == kind]
        return [item for item in rows if stuck is None or (item.age(now) > item.stuck_after) == stuck]
