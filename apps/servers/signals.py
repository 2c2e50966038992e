"""Signals of the servers domain, for higher layers (routing) to react without servers importing them."""

from django.dispatch import Signal

# Sent after a server's state changed (``server_id``), or after many did (``server_id`` is None).
server_state_changed = Signal()
