from django import template

from apps.core.templatetags.units import format_bytes

register = template.Library()


@register.filter
def gib(value: int | None) -> str:
    """Bytes in the unit that reads best (the dashboard's one helper, ``units.size``); kept under its old
    name for the templates that load it."""
    return format_bytes(value)


@register.filter
def duration(seconds: float | int | None) -> str:
    """Seconds as the largest sensible units: ``45 s``, ``12 min 5 s``, ``3 h 20 min``, ``2 d 4 h``."""
    if seconds is None:
        return "—"
    total = round(float(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


@register.filter
def split(value: str) -> list[str]:
    return value.split()
