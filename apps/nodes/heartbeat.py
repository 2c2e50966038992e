"""Heartbeats: everything an agent reports is validated at the boundary, then recorded in ONE statement.

The report is decoded by msgspec straight into typed structs (unknown fields refused, every number
bounded; the types bound the nesting, so a body nested thousands deep is refused at its first level,
and a NUL in any string is refused before PostgreSQL would), then checked across fields (used ≤ total,
managed ≤ used, ...). Recording is a single SQL statement, so a heartbeat is atomic (nothing
half-written) and costs one round trip: it authenticates the credential, updates the node, upserts its
GPUs, drops GPUs no longer reported and, when the node was not online, writes the transition's event row
and clears its liveness alerts. The statement takes a batch: the endpoint writes the heartbeats that arrive
together in one statement and one commit, and answers each once that commit is done.

The serving path is the lean ASGI endpoint in ``apps.nodes.fastpath`` (the heartbeat benchmark is why);
``record_heartbeat`` runs the same statement through Django's connection for in-process callers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec
from django.db import connection

from apps.alerts.models import Alert
from apps.nodes import agent_url, codes
from apps.nodes.choices import EventKind, Liveness
from apps.nodes.models import GPU, ListeningClock, Node, NodeEvent, digest, liveness_now_sql
from modelforge.jsonbounds import json_has_nul, nul_message

MAX_GPUS = 64
MAX_MODELS = 1000
MAX_BYTES = 2**50  # 1 PiB: larger than any real memory, small enough to catch garbage

Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)]
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    """An agent can set only what it reports: an unknown field is refused, never ignored."""


class CpuReport(_Strict):
    count: Annotated[int, msgspec.Meta(ge=1, le=4096)]
    load_1m: Annotated[float, msgspec.Meta(ge=0, le=1_000_000)]


class MemoryReport(_Strict):
    total_bytes: Bytes
    available_bytes: Bytes


class ShmReport(_Strict):
    total_bytes: Bytes
    free_bytes: Bytes


class GpuReport(_Strict):
    index: Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS - 1)]
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=96)]
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    memory_total_bytes: Annotated[int, msgspec.Meta(ge=1, le=MAX_BYTES)]
    memory_used_bytes: Bytes
    memory_managed_bytes: Bytes
    utilization_percent: Annotated[int, msgspec.Meta(ge=0, le=100)]
    temperature_c: Annotated[int, msgspec.Meta(ge=-50, le=150)]


class ModelPresentReport(_Strict):
    name: Text
    kind: Literal["weights_directory", "gguf_file", "gguf_directory"]


MAX_SERVERS = 256
MAX_REQUESTS = 1_000_000  # an engine's running or waiting requests; more is garbage, not load


class EngineReport(_Strict):
    """An engine's own account of its load, read by the agent from its metrics (agent/engine_signals.py)."""

    running: Annotated[int, msgspec.Meta(ge=0, le=MAX_REQUESTS)]
    waiting: Annotated[int, msgspec.Meta(ge=0, le=MAX_REQUESTS)]
    # The agent's clock (Unix seconds) when it read them; the control plane keeps its own receipt time.
    at: Annotated[float, msgspec.Meta(ge=0, le=2**40)]
    kv_cache_used: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None


class ServerReport(_Strict):
    """One model server this node runs; only ``engine`` so far, and only where its engine says."""

    server_id: UUID
    engine: EngineReport | None = None


class HeartbeatReport(_Strict):
    """One heartbeat: inventory and telemetry of the node, as the agent measured it."""

    agent_version: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
    accelerator: Literal["nvidia", "cpu"]
    cpu: CpuReport
    memory: MemoryReport
    shm: ShmReport
    gpus: Annotated[list[GpuReport], msgspec.Meta(max_length=MAX_GPUS)]
    models_present: Annotated[list[ModelPresentReport], msgspec.Meta(max_length=MAX_MODELS)]
    agent_url: Annotated[str, msgspec.Meta(max_length=255)] = ""
    servers: Annotated[list[ServerReport], msgspec.Meta(max_length=MAX_SERVERS)] = []


class InvalidReport(Exception):
    """The report cannot be recorded; ``code`` and ``message`` go into the envelope."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_decoder = msgspec.json.Decoder(HeartbeatReport)
_encode = msgspec.json.Encoder().encode


def parse_report(body: bytes) -> HeartbeatReport:
    """Decode and validate; raise ``InvalidReport`` naming the field at fault."""
    try:
        report = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise InvalidReport("VALIDATION_ERROR", f"Invalid input: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidReport("MALFORMED_REQUEST", f"The body is not valid JSON: {exc}") from None
    if json_has_nul(body):
        # PostgreSQL's text cannot hold a NUL: the statement would fail and the heartbeat be lost. Checked
        # on the bytes (a find, on the hottest write), so no per-string pattern runs in the decoder.
        raise InvalidReport("VALIDATION_ERROR", "Invalid input: " + nul_message(body))
    problems = list(_cross_field_problems(report))
    if problems:
        raise InvalidReport("VALIDATION_ERROR", "Invalid input: " + "; ".join(problems))
    return report


def _cross_field_problems(report: HeartbeatReport) -> Any:
    if report.memory.available_bytes > report.memory.total_bytes:
        yield "memory: available_bytes exceeds total_bytes - at `$.memory`"
    if report.shm.free_bytes > report.shm.total_bytes:
        yield "shm: free_bytes exceeds total_bytes - at `$.shm`"
    seen: set[int] = set()
    for position, gpu in enumerate(report.gpus):
        where = f"at `$.gpus[{position}]`"
        if gpu.memory_used_bytes > gpu.memory_total_bytes:
            yield f"gpus: memory_used_bytes exceeds memory_total_bytes - {where}"
        if gpu.memory_managed_bytes > gpu.memory_used_bytes:
            yield f"gpus: memory_managed_bytes exceeds memory_used_bytes - {where}"
        if gpu.index in seen:
            yield f"gpus: index {gpu.index} is reported twice - {where}"
        seen.add(gpu.index)
    if report.accelerator == "cpu" and report.gpus:
        yield "gpus: a cpu node reports no GPUs - at `$.gpus`"
    if report.accelerator == "nvidia" and not report.gpus:
        yield "gpus: an nvidia node reports at least one GPU - at `$.gpus`"
    servers: set[UUID] = set()
    for position, server in enumerate(report.servers):
        if server.server_id in servers:
            yield f"servers: server {server.server_id} is reported twice - at `$.servers[{position}]`"
        servers.add(server.server_id)
    if report.agent_url:  # empty: the node's URL stays as it is
        why = agent_url.refusal(report.agent_url)  # enrollment's rule
        if why is not None:
            yield f"agent_url: {why} - at `$.agent_url`"


# Table and column names are ours; the batch is the one parameter. A batch is the heartbeats one web process
# received while its previous batch was being written (apps.nodes.fastpath.HeartbeatBatcher), as one JSON
# text: one statement and one commit for all of them. Each heartbeat keeps its own time and its position
# ``k``, which comes back with its node row; a heartbeat whose credential matches no node returns no row.
# No two heartbeats of a batch carry the same credential (the GPU upsert could not touch a row twice).
# Node rows are locked in id order, so two batches that share nodes wait for each other, never deadlock.
# The planner takes jsonb_to_recordset for 100 rows and would hash-join whole tables (a sequential scan of
# every node and every GPU per batch, measured); the endpoint's connections run it with nested loops on
# the indexes and one generic plan (``fastpath.PLANNER_OPTIONS``).
_CLOCK = ListeningClock._meta.db_table
# The node's state before this heartbeat, fleet states included; the clock is read as two one-row
# subqueries (joining its row made a heartbeat six times costlier in PostgreSQL, bench/heartbeats 2026-12-06).
_WAS = liveness_now_sql(
    f"(SELECT fleet_offline_before FROM {_CLOCK})",  # noqa: S608 -- table names are ours
    f"(SELECT fleet_stale_before FROM {_CLOCK})",  # noqa: S608
    table="n",
)
HEARTBEAT_SQL = f"""
WITH h AS MATERIALIZED (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb) AS h(
        k int, credential_hash text, at timestamptz, agent_version text, agent_url text, accelerator text,
        cpu_count int, load_1m float8, memory_total bigint, memory_available bigint, shm_total bigint,
        shm_free bigint, models jsonb, gpus jsonb)
), before AS (
    SELECT n.id, h.*, {_WAS} AS liveness
    FROM h JOIN {Node._meta.db_table} AS n ON n.credential_hash = h.credential_hash
    ORDER BY n.id FOR UPDATE OF n
), node AS (
    UPDATE {Node._meta.db_table} AS n
    SET last_heartbeat_at = b.at, liveness = '{Liveness.ONLINE}', agent_version = b.agent_version,
        agent_url = COALESCE(NULLIF(b.agent_url, ''), n.agent_url), accelerator = b.accelerator,
        cpu_count = b.cpu_count, load_1m = b.load_1m,
        memory_total_bytes = b.memory_total, memory_available_bytes = b.memory_available,
        shm_total_bytes = b.shm_total, shm_free_bytes = b.shm_free, models_present = b.models
    FROM before AS b WHERE n.id = b.id
    RETURNING n.id, n.enabled, b.liveness AS was, b.k, b.at, b.gpus
), gpus AS (
    INSERT INTO {GPU._meta.db_table} (node_id, "index", uuid, name, memory_total_bytes, memory_used_bytes,
                                      memory_managed_bytes, utilization_percent, temperature_c, reported_at)
    SELECT node.id, g."index", g.uuid, g.name, g.memory_total_bytes, g.memory_used_bytes,
           g.memory_managed_bytes, g.utilization_percent, g.temperature_c, node.at
    FROM node, jsonb_to_recordset(node.gpus) AS g(
        "index" int, uuid text, name text, memory_total_bytes bigint, memory_used_bytes bigint,
        memory_managed_bytes bigint, utilization_percent int, temperature_c int)
    ON CONFLICT (node_id, "index") DO UPDATE SET
        uuid = EXCLUDED.uuid, name = EXCLUDED.name, memory_total_bytes = EXCLUDED.memory_total_bytes,
        memory_used_bytes = EXCLUDED.memory_used_bytes, memory_managed_bytes = EXCLUDED.memory_managed_bytes,
        utilization_percent = EXCLUDED.utilization_percent, temperature_c = EXCLUDED.temperature_c,
        reported_at = EXCLUDED.reported_at
), pruned AS (
    DELETE FROM {GPU._meta.db_table} AS d USING node
    WHERE d.node_id = node.id
      AND d."index" NOT IN (SELECT (e ->> 'index')::int FROM jsonb_array_elements(node.gpus) AS e)
), event AS (
    INSERT INTO {NodeEvent._meta.db_table} (node_id, kind, from_liveness, to_liveness, at, detail)
    SELECT id, '{EventKind.LIVENESS}', was, '{Liveness.ONLINE}', at, 'heartbeat' FROM node
    WHERE was <> '{Liveness.ONLINE}'
), cleared AS (
    UPDATE {Alert._meta.db_table} AS a SET cleared_at = due.at
    FROM (
        SELECT node.at, unnest(ARRAY['{codes.ALERT_NODE_STALE}:node:' || node.id::text,
                                     '{codes.ALERT_NODE_OFFLINE}:node:' || node.id::text]) AS dedup_key
        FROM node WHERE node.was <> '{Liveness.ONLINE}'
    ) AS due
    WHERE a.dedup_key = due.dedup_key AND a.cleared_at IS NULL
)
SELECT k, id, enabled, was FROM node
"""  # noqa: S608


class HeartbeatRow(msgspec.Struct):
    """One heartbeat of a batch, as the statement reads it (field names are the recordset's columns)."""

    k: int
    credential_hash: str
    at: datetime
    agent_version: str
    agent_url: str
    accelerator: str
    cpu_count: int
    load_1m: float
    memory_total: int
    memory_available: int
    shm_total: int
    shm_free: int
    models: list[ModelPresentReport]
    gpus: list[GpuReport]


def heartbeat_row(credential_hash: str, report: HeartbeatReport, now: datetime, k: int = 0) -> HeartbeatRow:
    return HeartbeatRow(
        k=k,
        credential_hash=credential_hash,
        at=now,
        agent_version=report.agent_version,
        agent_url=report.agent_url,
        accelerator=report.accelerator,
        cpu_count=report.cpu.count,
        load_1m=report.cpu.load_1m,
        memory_total=report.memory.total_bytes,
        memory_available=report.memory.available_bytes,
        shm_total=report.shm.total_bytes,
        shm_free=report.shm.free_bytes,
        models=report.models_present,
        gpus=report.gpus,
    )


def batch_params(rows: list[HeartbeatRow]) -> dict[str, str]:
    """The whole batch as one JSON text: one parameter to send, however many heartbeats."""
    return {"batch": _encode(rows).decode()}


def record_heartbeat(credential: str, report: HeartbeatReport, now: datetime) -> tuple[str, bool, str] | None:
    """Record through Django's connection; ``(node id, enabled, liveness before)``, or ``None`` when the
    credential is unknown. The ASGI endpoint runs the very same statement, a batch at a time."""
    with connection.cursor() as cursor:
        cursor.execute(HEARTBEAT_SQL, batch_params([heartbeat_row(digest(credential), report, now)]))
        row = cursor.fetchone()
    return (str(row[1]), row[2], row[3]) if row else None


def report_schema() -> dict[str, Any]:
    """The report's JSON schema, for the OpenAPI document."""
    schema: dict[str, Any] = msgspec.json.schema(HeartbeatReport, ref_template="#/components/schemas/{name}")
    return schema
