from django.db import models


class Liveness(models.TextChoices):
    PENDING = "pending", "Pending (no heartbeat yet)"
    ONLINE = "online", "Online"
    STALE = "stale", "Stale"
    OFFLINE = "offline", "Offline"


# Liveness states the sweep moves out of.
SWEPT = (Liveness.ONLINE, Liveness.STALE)


class Accelerator(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA GPU"
    CPU = "cpu", "CPU only"


class EventKind(models.TextChoices):
    ENROLLED = "enrolled", "Enrolled"
    LIVENESS = "liveness", "Liveness changed"
    ENABLED = "enabled", "Enabled"
    DISABLED = "disabled", "Disabled"
    SECRET_MISMATCH = "secret_mismatch", "Cluster secret mismatch"
    SECRET_OK = "secret_ok", "Cluster secret accepted again"
    AGENT_UNREACHABLE = "agent_unreachable", "Agent unreachable"
