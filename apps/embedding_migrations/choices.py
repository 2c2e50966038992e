"""States and enumerations of the embedding-migrations domain, as TextChoices with their named groups."""

from django.db import models


class Pooling(models.TextChoices):
    MEAN = "mean", "Mean"
    CLS = "cls", "CLS token"
    LAST = "last", "Last token"
    UNKNOWN = "unknown", "Not declared"


class Stage(models.TextChoices):
    PLANNED = "planned", "Planned"
    PROVISIONING = "provisioning", "Provisioning"
    REINDEXING = "reindexing", "Reindexing"
    VERIFYING = "verifying", "Verifying"
    READY_TO_CUT = "ready_to_cut", "Ready to cut"
    CUTTING_OVER = "cutting_over", "Cutting over"
    COMPLETED = "completed", "Completed"
    ROLLED_BACK = "rolled_back", "Rolled back"
    FAILED = "failed", "Failed"


# Stages a task works in. Each touches the store: provisioning creates the target, reindexing writes it,
# verifying builds its search index (at the first alias onto it) and queries it, cutting over swaps.
RUNNING_STAGES = (Stage.PROVISIONING, Stage.REINDEXING, Stage.VERIFYING, Stage.CUTTING_OVER)
FINAL_STAGES = (Stage.COMPLETED, Stage.ROLLED_BACK)
UNFINISHED = [s for s in Stage.values if s not in FINAL_STAGES]
