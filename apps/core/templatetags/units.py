"""The dashboard's one formatting helper: sizes, rates, GPU counts and ages, as template filters.

Every page formats these the same way: ``{% load units %}`` then ``size``, ``rate``, ``gpus``, ``age``.
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone

register = template.Library()

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
DASH = "—"


def _number(value: float) -> str:
    """Two decimals under 10, one above; trailing zeros dropped (``1.25``, ``110.5``, ``256``)."""
    digits = 2 if value < 10 else 1
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_bytes(value: float | int | None) -> str:
    """``67 B``, ``1.5 KiB``, ``256 MiB``, ``0.25 GiB`` never (it is ``256 MiB``), ``110.5 GiB``."""
    if value is None or value == "":
        return DASH
    amount = float(value)
    unit = 0
    while abs(amount) >= 1024 and unit < len(UNITS) - 1:
        amount /= 1024
        unit += 1
    if unit == 0:
        return f"{int(amount)} B"
    return f"{_number(amount)} {UNITS[unit]}"


def format_rate(bytes_per_second: float | int | None) -> str:
    """A transfer rate in the same units per second: ``67 B/s``, ``41.2 MiB/s``."""
    if bytes_per_second is None or bytes_per_second == "":
        return DASH
    return f"{format_bytes(bytes_per_second)}/s"


def format_gpus(count: int | None) -> str:
    """``no GPU (CPU)``, ``1 GPU``, ``4 GPUs``."""
    if count is None or count == "":
        return DASH
    count = int(count)
    if count == 0:
        return "no GPU (CPU)"
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def format_age(moment: datetime | None, now: datetime | None = None) -> str:
    """How long ago: ``just now`` (under 5 s), ``12 s ago``, ``3 min ago``, ``2 h 5 min ago``, ``3 d ago``."""
    if moment is None or moment == "":
        return "never"
    seconds = int(((now or timezone.now()) - moment).total_seconds())
    if seconds < 0:
        return "just now"  # a clock a little ahead of ours: not "in the future"
    if seconds < 5:
        return "just now"
    if seconds < 60:
        return f"{seconds} s ago"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min ago"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min ago" if minutes and hours < 10 else f"{hours} h ago"
    return f"{hours // 24} d ago"


register.filter("size", format_bytes)
register.filter("rate", format_rate)
register.filter("gpus", format_gpus)
register.filter("age", format_age)
