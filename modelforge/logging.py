"""The correlation id of the request being served, and the log filter that stamps it on every line."""

from __future__ import annotations

import logging
import random
import re
from contextvars import ContextVar

# No request in progress (start-up, a Celery task without one): the log shows "-".
NO_CORRELATION = "-"
_correlation_id: ContextVar[str] = ContextVar("modelforge_correlation_id", default=NO_CORRELATION)

# What a caller may send as X-Correlation-ID: short, printable, no spaces, nothing to inject into logs.
WELL_FORMED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{7,127}$")


def current_correlation_id() -> str:
    return _correlation_id.get()


def set_correlation_id(value: str) -> None:
    _correlation_id.set(value)


def accept_or_generate(header_value: str | None) -> str:
    """Use the caller's id when it is well formed; otherwise make a new one."""
    if header_value and WELL_FORMED.match(header_value):
        return header_value
    # Not a secret, only unique: random bits without a system call (uuid4 reads os.urandom per id, a
    # measurable share of the gateway's per-request CPU).
    return f"{random.getrandbits(128):032x}"


class CorrelationIdFilter(logging.Filter):
    """Adds ``correlation_id`` to every record so the format can always print it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "correlation_id"):
            record.correlation_id = current_correlation_id()
        return True
