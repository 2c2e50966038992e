"""Server-rendered SVG charts for the telemetry history pages: no script, no chart library, no CDN.

A chart is a time axis and one or more series. ``stacked`` draws the series as areas on top of one
another (GPU memory: managed, external, free add up to the total); otherwise each is a line.

1. The x axis spans the first to the last sample's time; the y axis 0 to ``y_max`` (the series' peak
   when not given), so a flat line at zero is still drawn on a visible scale.
2. Each value maps to a point; ``None`` (a reading the node did not report) breaks the line.
3. Axis labels: three y ticks formatted by ``y_format``, the first, middle and last times on x.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 10, 22
GIB = 1024**3


@dataclass(frozen=True)
class Series:
    """One named line (or area) of a chart; ``colour`` is any CSS colour."""

    name: str
    colour: str
    values: Sequence[float | None]


def gib(value: float) -> str:
    if not value:
        return "0"
    return f"{value / GIB:.1f} GiB" if value < 10 * GIB else f"{value / GIB:.0f} GiB"


def percent(value: float) -> str:
    return f"{value:.0f} %"


def plain(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def chart(
    chart_id: str,
    title: str,
    times: Sequence[datetime],
    series: Sequence[Series],
    *,
    y_format: Callable[[float], str] = plain,
    y_max: float | None = None,
    stacked: bool = False,
) -> SafeString:
    """The SVG of one chart, with a legend; empty when there is nothing to draw."""
    if not times or not series:
        return SafeString()
    layers = _stack(series) if stacked else [[v for v in s.values] for s in series]
    peak = max((v for layer in layers for v in layer if v is not None), default=0.0)
    top = y_max if y_max is not None and y_max > 0 else (peak or 1.0)
    x_of = _x_scale(times)

    def y_of(value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - min(value, top) / top)

    parts: list[SafeString] = []
    floor = [0.0] * len(times)
    for s, layer in zip(series, layers, strict=True):
        if stacked:
            upper = [(x_of(i), y_of(v or 0.0)) for i, v in enumerate(layer)]
            lower = [(x_of(i), y_of(f)) for i, f in reversed(list(enumerate(floor)))]
            parts.append(
                format_html(
                    '<polygon class="series" data-series="{}" points="{}" fill="{}" fill-opacity="0.75" '
                    'stroke="{}" stroke-width="1"><title>{}</title></polygon>',
                    s.name,
                    _points(upper + lower),
                    s.colour,
                    s.colour,
                    s.name,
                )
            )
            floor = [v or 0.0 for v in layer]
        else:
            for run in _runs(layer):
                parts.append(
                    format_html(
                        '<polyline class="series" data-series="{}" points="{}" fill="none" stroke="{}" '
                        'stroke-width="2"><title>{}</title></polyline>',
                        s.name,
                        _points([(x_of(i), y_of(v)) for i, v in run]),
                        s.colour,
                        s.name,
                    )
                )
    axes = _axes(times, top, y_format, x_of, y_of)
    legend = _join(
        [
            format_html('<li><span class="swatch" style="background:{}"></span>{}</li>', s.colour, s.name)
            for s in series
        ]
    )
    return format_html(
        '<figure class="chart" id="{}"><figcaption>{}</figcaption>'
        '<svg viewBox="0 0 {} {}" width="100%" role="img" aria-label="{}" '
        'xmlns="http://www.w3.org/2000/svg" font-size="11" font-family="sans-serif">{}{}</svg>'
        '<ul class="legend">{}</ul></figure>',
        chart_id,
        title,
        WIDTH,
        HEIGHT,
        title,
        axes,
        _join(parts),
        legend,
    )


def _join(pieces: Sequence[SafeString]) -> SafeString:
    """Concatenate already-built markup (``format_html`` escapes anything that is not)."""
    return format_html("{}" * len(pieces), *pieces) if pieces else SafeString()


def _stack(series: Sequence[Series]) -> list[list[float | None]]:
    """Running sums: each layer's top is the sum of it and every layer below."""
    sums = [0.0] * max(len(s.values) for s in series)
    layers: list[list[float | None]] = []
    for s in series:
        sums = [total + (s.values[i] or 0.0 if i < len(s.values) else 0.0) for i, total in enumerate(sums)]
        layers.append(list(sums))
    return layers


def _x_scale(times: Sequence[datetime]) -> Callable[[int], float]:
    start, end = times[0].timestamp(), times[-1].timestamp()
    span = end - start
    inner = WIDTH - LEFT - RIGHT

    def x_of(index: int) -> float:
        if span <= 0:
            return LEFT + inner / 2
        return LEFT + inner * (times[index].timestamp() - start) / span

    return x_of


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Unbroken stretches of reported values (a ``None`` ends one)."""
    runs: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            runs.append([])
        else:
            runs[-1].append((i, v))
    return [run for run in runs if run]


def _points(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _axes(
    times: Sequence[datetime],
    top: float,
    y_format: Callable[[float], str],
    x_of: Callable[[int], float],
    y_of: Callable[[float], float],
) -> SafeString:
    bottom = HEIGHT - BOTTOM
    lines = [
        format_html(
            '<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888"/>', LEFT, TOP, LEFT, bottom
        ),
        format_html(
            '<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888"/>',
            LEFT,
            bottom,
            WIDTH - RIGHT,
            bottom,
        ),
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = f"{y_of(top * fraction):.1f}"
        lines.append(
            format_html(
                '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#ddd" stroke-dasharray="2,3"/>'
                '<text class="y-label" x="{}" y="{}" text-anchor="end" dominant-baseline="middle" '
                'fill="#555">{}</text>',
                LEFT,
                y,
                WIDTH - RIGHT,
                y,
                LEFT - 6,
                y,
                y_format(top * fraction),
            )
        )
    indexes = sorted({0, len(times) // 2, len(times) - 1})
    for i in indexes:
        ends = {0: "start", len(times) - 1: "end"} if len(indexes) > 1 else {}
        anchor = ends.get(i, "middle")
        lines.append(
            format_html(
                '<text class="x-label" x="{}" y="{}" text-anchor="{}" fill="#555">{}</text>',
                f"{x_of(i):.1f}",
                HEIGHT - 6,
                anchor,
                f"{localtime(times[i]):%H:%M:%S}",
            )
        )
    return _join(lines)
