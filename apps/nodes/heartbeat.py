"""Heartbeats: validate everything an agent reports, then record it in a few set-based statements."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, transaction
from rest_framework import serializers

from apps.alerts.models import Alert
from apps.nodes import codes
from apps.nodes.choices import Accelerator, EventKind, Liveness
from apps.nodes.models import GPU, Node, NodeEvent

MAX_GPUS = 64
MAX_MODELS = 1000
MAX_BYTES = 2**50  # 1 PiB: larger than any real memory, small enough to catch garbage


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know: an agent can set only what it reports."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def _bytes() -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=MAX_BYTES)


class CpuSerializer(StrictSerializer):
    count = serializers.IntegerField(min_value=1, max_value=4096)
    load_1m = serializers.FloatField(min_value=0, max_value=1_000_000)


class MemorySerializer(StrictSerializer):
    total_bytes = _bytes()
    available_bytes = _bytes()

    def validate(self, attrs: dict[str, int]) -> dict[str, int]:
        if attrs["available_bytes"] > attrs["total_bytes"]:
            raise serializers.ValidationError("available_bytes exceeds total_bytes.")
        return attrs


class ShmSerializer(StrictSerializer):
    total_bytes = _bytes()
    free_bytes = _bytes()

    def validate(self, attrs: dict[str, int]) -> dict[str, int]:
        if attrs["free_bytes"] > attrs["total_bytes"]:
            raise serializers.ValidationError("free_bytes exceeds total_bytes.")
        return attrs


class GpuSerializer(StrictSerializer):
    index = serializers.IntegerField(min_value=0, max_value=MAX_GPUS - 1)
    uuid = serializers.CharField(max_length=96)
    name = serializers.CharField(max_length=128)
    memory_total_bytes = serializers.IntegerField(min_value=1, max_value=MAX_BYTES)
    memory_used_bytes = _bytes()
    memory_managed_bytes = _bytes()
    utilization_percent = serializers.IntegerField(min_value=0, max_value=100)
    temperature_c = serializers.IntegerField(min_value=-50, max_value=150)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["memory_used_bytes"] > attrs["memory_total_bytes"]:
            raise serializers.ValidationError("memory_used_bytes exceeds memory_total_bytes.")
        if attrs["memory_managed_bytes"] > attrs["memory_used_bytes"]:
            raise serializers.ValidationError("memory_managed_bytes exceeds memory_used_bytes.")
        return attrs


class ModelPresentSerializer(StrictSerializer):
    name = serializers.CharField(max_length=255)
    kind = serializers.ChoiceField(choices=["weights_directory", "gguf_file", "gguf_directory"])


class HeartbeatSerializer(StrictSerializer):
    agent_version = serializers.CharField(max_length=32)
    accelerator = serializers.ChoiceField(choices=Accelerator.choices)
    agent_url = serializers.URLField(max_length=255, required=False, allow_blank=True)
    cpu = CpuSerializer()
    memory = MemorySerializer()
    shm = ShmSerializer()
    gpus = GpuSerializer(many=True, max_length=MAX_GPUS)  # type: ignore[call-arg]
    models_present = ModelPresentSerializer(many=True, max_length=MAX_MODELS)  # type: ignore[call-arg]

    def validate_gpus(self, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        indexes = [gpu["index"] for gpu in gpus]
        if len(set(indexes)) != len(indexes):
            raise serializers.ValidationError("GPU indexes must be unique.")
        return gpus

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["accelerator"] == Accelerator.CPU and attrs["gpus"]:
            raise serializers.ValidationError({"gpus": ["A cpu node reports no GPUs."]})
        if attrs["accelerator"] == Accelerator.NVIDIA and not attrs["gpus"]:
            raise serializers.ValidationError({"gpus": ["An nvidia node reports at least one GPU."]})
        return attrs


_NODE_UPDATE = f"""
UPDATE {Node._meta.db_table} AS n
SET last_heartbeat_at = %(now)s, liveness = 'online', agent_version = %(agent_version)s,
    agent_url = COALESCE(NULLIF(%(agent_url)s, ''), n.agent_url), accelerator = %(accelerator)s,
    cpu_count = %(cpu_count)s, load_1m = %(load_1m)s,
    memory_total_bytes = %(memory_total)s, memory_available_bytes = %(memory_available)s,
    shm_total_bytes = %(shm_total)s, shm_free_bytes = %(shm_free)s, models_present = %(models)s::jsonb
FROM (SELECT id, liveness FROM {Node._meta.db_table} WHERE id = %(id)s FOR UPDATE) AS before
WHERE n.id = before.id
RETURNING before.liveness, n.enabled
"""  # noqa: S608 -- table names are ours

_GPU_UPSERT = f"""
INSERT INTO {GPU._meta.db_table} (node_id, "index", uuid, name, memory_total_bytes, memory_used_bytes,
                                  memory_managed_bytes, utilization_percent, temperature_c, reported_at)
SELECT %(id)s, g.i, g.u, g.n, g.t, g.used, g.managed, g.util, g.temp, %(now)s
FROM unnest(%(i)s::int[], %(u)s::text[], %(n)s::text[], %(t)s::bigint[], %(used)s::bigint[],
            %(managed)s::bigint[], %(util)s::int[], %(temp)s::int[])
     AS g(i, u, n, t, used, managed, util, temp)
ON CONFLICT (node_id, "index") DO UPDATE SET
    uuid = EXCLUDED.uuid, name = EXCLUDED.name, memory_total_bytes = EXCLUDED.memory_total_bytes,
    memory_used_bytes = EXCLUDED.memory_used_bytes, memory_managed_bytes = EXCLUDED.memory_managed_bytes,
    utilization_percent = EXCLUDED.utilization_percent, temperature_c = EXCLUDED.temperature_c,
    reported_at = EXCLUDED.reported_at
"""  # noqa: S608

_GPU_PRUNE = f'DELETE FROM {GPU._meta.db_table} WHERE node_id = %(id)s AND NOT ("index" = ANY(%(i)s::int[]))'  # noqa: S608


def record_heartbeat(node_id: Any, report: dict[str, Any], now: datetime) -> tuple[str, bool]:
    """Record a validated report in one transaction; returns (liveness before, enabled).

    1. Update the node's reported fields and liveness under its row lock, reading the state before.
    2. Upsert every reported GPU in one statement; drop GPUs no longer reported.
    3. If the node was not online: record the transition and clear its liveness alerts
       (``node_offline`` clears itself on the next successful heartbeat).
    """
    import json

    gpus = report["gpus"]
    params = {
        "id": node_id,
        "now": now,
        "agent_version": report["agent_version"],
        "agent_url": report.get("agent_url", ""),
        "accelerator": report["accelerator"],
        "cpu_count": report["cpu"]["count"],
        "load_1m": report["cpu"]["load_1m"],
        "memory_total": report["memory"]["total_bytes"],
        "memory_available": report["memory"]["available_bytes"],
        "shm_total": report["shm"]["total_bytes"],
        "shm_free": report["shm"]["free_bytes"],
        "models": json.dumps(report["models_present"]),
        "i": [g["index"] for g in gpus],
        "u": [g["uuid"] for g in gpus],
        "n": [g["name"] for g in gpus],
        "t": [g["memory_total_bytes"] for g in gpus],
        "used": [g["memory_used_bytes"] for g in gpus],
        "managed": [g["memory_managed_bytes"] for g in gpus],
        "util": [g["utilization_percent"] for g in gpus],
        "temp": [g["temperature_c"] for g in gpus],
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_NODE_UPDATE, params)
        before, enabled = cursor.fetchone()
        if gpus:
            cursor.execute(_GPU_UPSERT, params)
        cursor.execute(_GPU_PRUNE, params)
        if before != Liveness.ONLINE:
            NodeEvent.objects.create(
                node_id=node_id,
                kind=EventKind.LIVENESS,
                from_liveness=before,
                to_liveness=Liveness.ONLINE,
                at=now,
            )
            Alert.objects.clear_for(
                [codes.ALERT_NODE_STALE, codes.ALERT_NODE_OFFLINE], "node", str(node_id), at=now
            )
    return before, enabled
