from django.db import models


class ServerState(models.TextChoices):
    PENDING = "pending", "Pending"
    PLACING = "placing", "Placing"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    FAILED = "failed", "Failed"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"


# States whose reservations still hold memory on a GPU.
HOLDING = (ServerState.PLACING, ServerState.STARTING, ServerState.RUNNING, ServerState.STOPPING)
TERMINAL = (ServerState.FAILED, ServerState.STOPPED)

# Allowed transitions: from -> the states it may move to.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    ServerState.PENDING: (ServerState.PLACING, ServerState.FAILED),
    ServerState.PLACING: (ServerState.STARTING, ServerState.FAILED),
    ServerState.STARTING: (ServerState.RUNNING, ServerState.FAILED, ServerState.STOPPING),
    ServerState.RUNNING: (ServerState.STOPPING, ServerState.FAILED),
    ServerState.STOPPING: (ServerState.STOPPED, ServerState.FAILED),
    # A failed server comes back: restarted or re-placed (placing), or adopted when its agent reports the
    # process running after all (running).
    ServerState.FAILED: (ServerState.PLACING, ServerState.RUNNING),
    ServerState.STOPPED: (),
}


class RestartPolicy(models.TextChoices):
    NEVER = "never", "Never"
    ON_FAILURE = "on-failure", "On failure"
