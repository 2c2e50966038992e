"""The artifacts app's choices: the states and kinds its models and surfaces name."""

from django.db import models


class SourceKind(models.TextChoices):
    LOCAL = "local", "Local or NFS path"
    HTTP = "http", "HTTP(S) URL"
    HUGGINGFACE = "huggingface", "Hugging Face repository at a revision"


class ArtifactState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    ACQUIRING = "acquiring", "Acquiring"
    READY = "ready", "Ready"
    QUARANTINED = "quarantined", "Quarantined"
    FAILED = "failed", "Failed"


class ReplicaState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    COPYING = "copying", "Copying"
    PRESENT = "present", "Present"
    FAILED = "failed", "Failed"
