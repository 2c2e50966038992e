"""The clusters app's choices: the states and kinds its models and surfaces name."""

from django.db import models


class Algorithm(models.TextChoices):
    WEIGHTED_ROUND_ROBIN = "weighted_round_robin", "Weighted round-robin (smooth)"
    LEAST_CONNECTIONS = "least_connections", "Least connections"
    # Fewest estimated tokens in flight per unit of weight (apps/gateway/affinity.py).
    LEAST_OUTSTANDING = "least_outstanding", "Least outstanding work"
    # Consistent hashing with bounded loads over the request's prefix (apps/gateway/affinity.py).
    PREFIX_AFFINITY = "prefix_affinity", "Prefix affinity (prompt-cache aware)"


class CredentialKind(models.TextChoices):
    """Who a client credential is for: an application, or the dashboard's Playground (internal, minted
    for one operator and one capability, expiring within minutes)."""

    CLIENT = "client", "Client"
    PLAYGROUND = "playground", "Playground (internal)"
