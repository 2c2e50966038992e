from django import template

register = template.Library()


@register.filter
def gib(value: int | None) -> str:
    """Bytes as GiB with one decimal, or an em dash when unknown."""
    if value is None:
        return "—"
    return f"{value / 2**30:.1f} GiB"
