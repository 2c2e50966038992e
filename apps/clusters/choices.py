"""The clusters app's choices: the states and kinds its models and surfaces name."""

from django.db import models


class Algorithm(models.TextChoices):
    WEIGHTED_ROUND_ROBIN = "weighted_round_robin", "Weighted round-robin (smooth)"
    LEAST_CONNECTIONS = "least_connections", "Least connections"


class CredentialKind(models.TextChoices):
    """Who a client credential is for: an application, or the dashboard's Playground (internal, minted
    for one operator and one capability, expiring within minutes)."""

    CLIENT = "client", "Client"
    PLAYGROUND = "playground", "Playground (internal)"
