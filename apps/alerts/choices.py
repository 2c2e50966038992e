from django.db import models


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook (HTTP POST of JSON)"
    EMAIL = "email", "E-mail"


class NotificationEvent(models.TextChoices):
    RAISED = "raised", "Raised"
    CLEARED = "cleared", "Cleared"


class NotificationState(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed (gave up)"
