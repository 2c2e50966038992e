"""The backups app's choices: the states and kinds its models and surfaces name."""

from django.db import models


class BackupState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed (not yet verified)"
    VERIFIED = "verified", "Verified (restore-eligible)"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired (files removed by retention)"


class RestoreState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed (RESTORE_FAILED)"


class RestorePhaseName(models.TextChoices):
    PRE_CHECKS = "pre_checks", "Pre-checks"
    RESTORE = "restore", "Restore into a new database"
    VERIFICATION = "verification", "Verification"
    SWITCH_OVER = "switch_over", "Switch-over"
    POST_CHECKS = "post_checks", "Post-checks"


class ReviewDecision(models.TextChoices):
    ACKNOWLEDGE = "acknowledge", "Acknowledged (outcome stands)"
    ABANDON = "abandon", "Abandoned (left-over database dropped)"
