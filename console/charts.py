"""Small inline SVG line charts, drawn on the server: no chart library, nothing fetched by the browser.

`line_chart(points, unit=...)` draws one series of (epoch seconds, value) with its axes: the value
axis from 0 to a round maximum with three labelled ticks and its unit as title, the time axis with
the clock times (UTC) of its start, middle and end. The caption gives the latest value, the maximum
and the time span. Fewer than two points give a short "collecting" note instead: a plot starts with
the first view of a page (console/history.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 520, 200
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 10, 34  # room for the value labels, the unit and the time labels
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
VALUE_TICKS = 3  # 0, half, top
TIME_TICKS = ((0.0, "start"), (0.5, "middle"), (1.0, "end"))  # share of the span, text anchor


def line_chart(points: Sequence[tuple[float, float]], *, title: str, unit: str, source: str = "") -> str:
    """`unit` names the values ("msg/s", "messages"); `source` (where the points come from) follows the title."""
    label = escape(title)
    origin = f' <span class="muted">({escape(source)})</span>' if source else ""
    if len(points) < 2:
        return (f'<figure class="chart"><figcaption>{label}{origin}</figcaption>'
                '<p class="muted">collecting: a point is added every sampling interval while the page is watched</p>'
                "</figure>")  # fmt: skip
    t0, t1 = points[0][0], points[-1][0]
    peak = max(v for _, v in points)
    top = nice_ceiling(peak)
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * PLOT_W

    def y(v: float) -> float:
        return TOP + PLOT_H - v / top * PLOT_H

    coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}, in {escape(unit)}, over time">']
    for i in range(VALUE_TICKS):
        value = top * i / (VALUE_TICKS - 1)
        level = y(value)
        parts.append(f'<line x1="{LEFT}" y1="{level:.1f}" x2="{WIDTH - RIGHT}" y2="{level:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{level + 4:.1f}" class="tick" text-anchor="end">{_num(value)}</text>')
    for share, anchor in TIME_TICKS:
        t = t0 + span * share
        parts.append(f'<text x="{x(t):.1f}" y="{TOP + PLOT_H + 16}" class="tick" text-anchor="{anchor}">'
                     f"{clock(t)}</text>")  # fmt: skip
    parts += [
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + PLOT_H}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP + PLOT_H}" x2="{WIDTH - RIGHT}" y2="{TOP + PLOT_H}" class="axis"/>',
        f'<text x="12" y="{TOP + PLOT_H / 2:.1f}" class="unit" text-anchor="middle" '
        f'transform="rotate(-90 12 {TOP + PLOT_H / 2:.1f})">{escape(unit)}</text>',
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 2}" class="unit" text-anchor="end">time (UTC)</text>',
        f'<polyline points="{coords}" class="series"/></svg>',
    ]
    return (
        f'<figure class="chart"><figcaption>{label}: <b>{_num(points[-1][1])} {escape(unit)}</b> now, '
        f"max {_num(peak)} {escape(unit)}, last {_span(t1 - t0)}{origin}</figcaption>{''.join(parts)}</figure>"
    )


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (1 for nothing): a round top."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10.0 * power


def clock(epoch_s: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch_s))


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 or value == int(value) else f"{value:.2f}".rstrip("0").rstrip(".")


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
