"""Codes of the alerts domain (the envelope's ``code``, an alert's or an event's); docs/TROUBLESHOOTING.md
has each."""

# A channel did not take a message: the alert raised after the retries, and the test action's refusal.
NOTIFICATION_FAILED = "NOTIFICATION_FAILED"
# The event a channel's test message carries.
NOTIFICATION_TEST = "NOTIFICATION_TEST"
