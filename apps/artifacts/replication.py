"""Replication: explicit, never automatic. An operator asks for artifact X on node Y; the node's agent
fetches the files from the control plane's store (authenticated, resumable), verifies every digest and
places them where the presence check finds them; the control plane confirms with that check."""

from __future__ import annotations

from django.utils import timezone

from apps.artifacts.models import Artifact, ArtifactState, Replica, ReplicaState
from apps.nodes import agent_client
from apps.nodes.models import Node
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError

REPLICA_NOT_ALLOWED = "REPLICA_NOT_ALLOWED"


def replica_name(artifact: Artifact) -> str:
    if artifact.format == "gguf_file" and len(artifact.files) == 1:
        return artifact.files[0]["path"].rsplit("/", 1)[-1]
    return artifact.name


def request_replica(artifact: Artifact, node: Node, *, by: str) -> Replica:
    """Ask for ``artifact`` on ``node`` (again, if it failed); a Celery task does the copying."""
    if artifact.state != ArtifactState.READY:
        raise ApiError(
            REPLICA_NOT_ALLOWED,
            f"Artifact {artifact.name} is {artifact.state}; only a ready artifact "
            "(every supply-chain check passed) is replicated.",
            409,
        )
    replica, _ = Replica.objects.get_or_create(
        artifact=artifact, node=node, defaults={"name": replica_name(artifact)}
    )
    if replica.state in (ReplicaState.COPYING, ReplicaState.PRESENT):
        return replica
    replica.transition(
        ReplicaState.REQUESTED,
        detail=f"requested on {node.name}",
        by=by,
        reason="",
        done_bytes=0,
        copy_seconds=None,
        total_bytes=artifact.size_bytes,
        requested_by=by,
        updated_at=timezone.now(),
    )
    replica.refresh_from_db()
    from apps.artifacts.tasks import replicate

    send_on_commit(replicate, replica.pk)
    return replica


def start(replica: Replica) -> bool:
    """Ask the node's agent to copy ``replica``; the file list it gets is the artifact's record.

    Each file carries its SHA-256 and, when recorded, its BLAKE3: an agent of this release verifies the
    BLAKE3 (faster), an older agent ignores it and verifies the SHA-256 as before, and an agent refuses a
    file with no digest it can check (``REPLICA_DIGEST_MISSING``). An artifact acquired before BLAKE3s
    were recorded replicates with SHA-256 and has them recorded once, in the background, for next time.
    """
    artifact, node = replica.artifact, replica.node
    if any("blake3" not in item for item in artifact.files):
        from apps.artifacts.tasks import record_blake3

        send_on_commit(record_blake3, artifact.pk)
    try:
        reply = agent_client.call_agent(
            node,
            "POST",
            "/v1/replicas",
            {
                "replica_id": str(replica.pk),
                "name": replica.name,
                "base_url": f"/api/v1/agent/artifacts/{artifact.pk}/files",
                "files": artifact.files,
            },
        )
    except ApiError as exc:
        _fail(replica, f"{exc.code}: {exc.message}")
        return False
    if reply.status != 200:
        message = reply.body.get("message") or f"the agent answered {reply.status}"
        code = reply.body.get("code")
        _fail(replica, f"{code}: {message}" if isinstance(code, str) and code else message)
        return False
    now = timezone.now()
    replica.transition(
        ReplicaState.COPYING, detail=f"copying to {node.name}", updated_at=now, progress_at=now
    )
    return True


def check(replica: Replica) -> bool:
    """One look; True when settled. Present only after the node's own presence check says so."""
    try:
        reply = agent_client.call_agent(
            replica.node, "POST", "/v1/replicas/status", {"replica_id": str(replica.pk)}
        )
    except ApiError as exc:
        _fail(replica, f"{exc.code}: {exc.message}")
        return True
    state = reply.body.get("state")
    now = timezone.now()
    done = int(reply.body.get("done_bytes") or 0)
    # Progress is the copy moving forward, not the control plane looking: the stuck bound counts from it.
    Replica.objects.filter(pk=replica.pk, done_bytes__lt=done).update(progress_at=now)
    Replica.objects.filter(pk=replica.pk).update(done_bytes=done, updated_at=now)
    if state == "failed" or reply.status != 200:
        _fail(replica, reply.body.get("reason") or reply.body.get("message") or "the copy failed")
        return True
    if state != "present":
        return False
    presence = agent_client.model_presence(replica.node, replica.name)
    if presence.status == 200 and presence.body.get("present"):
        replica.transition(
            ReplicaState.PRESENT,
            detail="the node's presence check finds it",
            done_bytes=replica.total_bytes,
            copy_seconds=_copy_seconds(reply.body),
            updated_at=timezone.now(),
        )
    else:
        _fail(replica, "the agent finished, but the presence check does not find it")
    return True


def _copy_seconds(status: dict) -> float | None:
    """The agent's own start and finish times (one clock, the node's); None from an older agent."""
    started, finished = status.get("started_at"), status.get("finished_at")
    if isinstance(started, int | float) and isinstance(finished, int | float) and finished >= started:
        return round(float(finished - started), 3)
    return None


def _fail(replica: Replica, reason: str) -> None:
    replica.transition(ReplicaState.FAILED, detail=reason, reason=reason[:2000], updated_at=timezone.now())
