"""Codes of clusters and serving, spelled as the source documents spell them."""

CAPABILITY_NOT_AUTHORIZED = "CAPABILITY_NOT_AUTHORIZED"
NO_ELIGIBLE_NODE = "NO_ELIGIBLE_NODE"
CLUSTER_MEMBERSHIP_LOCKED = "CLUSTER_MEMBERSHIP_LOCKED"
UPSTREAM_FAILED = "UPSTREAM_FAILED"
UPSTREAM_TIMEOUT = "UPSTREAM_TIMEOUT"
UPSTREAM_REJECTED = "UPSTREAM_REJECTED"
# The capability's backends run an engine that does not serve the endpoint (their runtime profile's
# ``endpoints``): refused before any backend is contacted.
ENDPOINT_NOT_SERVED = "ENDPOINT_NOT_SERVED"
# Every backend the control plane lists for the capability fails its health probe (apps/gateway/probe.py):
# 503 with Retry-After, at once, rather than a request held by a backend that does not answer.
NO_HEALTHY_BACKEND = "NO_HEALTHY_BACKEND"
# Every tier the capability has for the credential binds a cluster with no server attached (detached for
# a membership change): 503 with Retry-After, naming the clusters, rather than NO_ELIGIBLE_NODE.
CLUSTER_DETACHED = "CLUSTER_DETACHED"

# Alert: a capability with routing tiers but no running backend (critical); cleared when one runs.
ALERT_CAPABILITY_UNSERVED = "CAPABILITY_UNSERVED"
# A client credential's limits (apps/gateway/limits.py): 429 with Retry-After.
RATE_LIMITED = "RATE_LIMITED"  # requests or tokens per minute, or concurrent requests
BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"  # its token budget for the day or the month (UTC)
# Admission (apps/gateway/admission.py): every usable backend is at its runtime profile's max_concurrent
# and the capability's queue is full, or the request waited in it past its deadline. 503 with Retry-After.
QUEUE_FULL = "QUEUE_FULL"
QUEUE_TIMEOUT = "QUEUE_TIMEOUT"
