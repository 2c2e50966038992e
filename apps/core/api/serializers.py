from rest_framework import serializers


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


class WorkerProbeSerializer(serializers.Serializer):
    task_id = serializers.CharField()
    status_url = serializers.CharField()
