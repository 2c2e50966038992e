from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone

from apps.core.transitions import StatefulModel
from apps.nodes.models import GPU, Node
from apps.servers.choices import HOLDING, TRANSITIONS, RestartPolicy, ServerState
from apps.servers.codes import INVALID_SERVER_STATE
from modelforge.dispatch import send_on_commit
from modelforge.errors import ApiError
from modelforge.errors import codes as error_codes


class ModelServer(StatefulModel):
    """A model server to run: which profile and model, where it was placed, and its state."""

    TRANSITIONS = TRANSITIONS
    INVALID_STATE_CODE = INVALID_SERVER_STATE

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63, unique=True)
    profile = models.CharField(max_length=63)
    model = models.CharField(max_length=255, help_text="The model's name under the node's models directory.")
    weights_bytes = models.BigIntegerField(null=True, blank=True)
    artifact = models.ForeignKey(
        "artifacts.Artifact", null=True, blank=True, on_delete=models.PROTECT, related_name="servers"
    )
    gpus_wanted = models.PositiveSmallIntegerField(default=0)
    encrypted = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=ServerState.choices, default=ServerState.PENDING)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.PROTECT, related_name="servers")
    memory_per_unit_bytes = models.BigIntegerField(default=0)
    memory_rule = models.CharField(max_length=200, blank=True)
    placement_explanation = models.JSONField(default=list, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    failure_code = models.CharField(max_length=64, blank=True)
    failure_message = models.TextField(blank=True)
    restart_policy = models.CharField(
        max_length=16, choices=RestartPolicy.choices, default=RestartPolicy.ON_FAILURE
    )
    restart_attempts = models.PositiveIntegerField(
        default=0, help_text="Automatic restarts since it last ran; reset when it runs again."
    )
    created_at = models.DateTimeField(default=timezone.now)
    running_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state"], name="servers_state_idx")]

    def __str__(self) -> str:
        return self.name

    def state_subject(self) -> str:
        return f"Server {self.name}"

    def transition_fields(self, to: str, now: datetime, fields: dict[str, Any]) -> None:
        if to == ServerState.RUNNING:
            fields.setdefault("running_at", now)
        if to in (ServerState.STOPPED, ServerState.FAILED):
            fields.setdefault("stopped_at", now)

    def record_transition(self, before: str, to: str, *, at: datetime, detail: str, by: str) -> None:
        self.transition_event(before, to, at=at, detail=detail).save()

    def transition_event(self, before: str, to: str, *, at: datetime, detail: str) -> ServerEvent:
        """The event row of a move (unsaved): ``record_transition``'s, and placement's two in one insert."""
        return ServerEvent(server=self, from_state=before, to_state=to, at=at, detail=detail[:500])

    def after_transition(self, before: str, to: str) -> None:
        if to not in HOLDING:
            Reservation.objects.filter(server=self).delete()
        # A transition is a compare-and-swap update, which sends no post_save: say so for routing, whose
        # tables follow running servers (the gateway's notice goes out when the transaction commits).
        from apps.servers.signals import server_state_changed

        server_state_changed.send(sender=type(self), server_id=self.pk)

    def request_stop(self, by: str) -> None:
        """Ask the agent to stop the process; the stop task finishes the transition."""

        from apps.servers.tasks import stop_server

        self.transition(ServerState.STOPPING, detail=f"stop requested by {by}")
        send_on_commit(stop_server, str(self.pk))

    def fail(self, code: str, message: str) -> None:
        self.transition(
            ServerState.FAILED, detail=f"{code}: {message}", failure_code=code, failure_message=message
        )

    def set_restart_policy(self, policy: str) -> bool:
        """Whether the restart policy brings this server back after a failure; ``True`` if it changed.
        Configuration, not a transition: any state may change it, and the recovery sweep reads it next."""
        if policy not in RestartPolicy.values:
            raise ApiError(
                error_codes.VALIDATION_ERROR,
                f"restart_policy: {policy!r} is not one of {', '.join(RestartPolicy.values)}.",
                400,
            )
        if policy == self.restart_policy:
            return False
        self.restart_policy = policy
        self.save(update_fields=["restart_policy"])
        return True


class Reservation(models.Model):
    """Memory set aside for a placed server on one GPU (or a cpu node's RAM, ``gpu`` empty) until the
    node's heartbeats reflect the server's own use."""

    server = models.ForeignKey(ModelServer, on_delete=models.CASCADE, related_name="reservations")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="reservations")
    gpu = models.ForeignKey(GPU, null=True, blank=True, on_delete=models.CASCADE, related_name="reservations")
    bytes = models.BigIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.server_id} on {self.gpu_id or self.node_id}: {self.bytes}"


class ServerEvent(models.Model):
    """A state transition of a model server."""

    server = models.ForeignKey(ModelServer, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    at = models.DateTimeField(default=timezone.now)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.server_id} {self.from_state}->{self.to_state}"


class ServerTombstone(models.Model):
    """A server an operator deleted while its process may still run (its node away): the agent's copy is
    stopped when the node reports it, with this row saying who asked and when."""

    server_id = models.UUIDField(primary_key=True)
    name = models.CharField(max_length=63)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    deleted_by = models.CharField(max_length=150)
    deleted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-deleted_at"]

    def __str__(self) -> str:
        return f"{self.name} (deleted by {self.deleted_by})"
