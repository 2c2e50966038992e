"""Codes of the observability domain (the envelope's ``code`` and the alert's); docs/TROUBLESHOOTING.md
has each."""

# The monitoring store failed: an alert in the authoritative database, and the API's 503.
OBSERVABILITY_DEGRADED = "OBSERVABILITY_DEGRADED"
