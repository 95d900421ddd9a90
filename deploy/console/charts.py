"""Small inline SVG line charts, drawn on the server: no chart library, nothing fetched by the browser.

`line_chart(points)` draws one series of (epoch seconds, value) as a polyline in a fixed view box
with the latest value, the maximum and the time span as text. Fewer than two points give a short
"collecting" note instead: a plot starts with the first view of a page (deploy/console/history.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, PAD = 480, 120, 4


def line_chart(points: Sequence[tuple[float, float]], *, title: str, unit: str = "", source: str = "") -> str:
    """`source` (where the points come from) is shown after the title."""
    label = escape(title)
    origin = f' <span class="muted">({escape(source)})</span>' if source else ""
    if len(points) < 2:
        return (f'<figure class="chart"><figcaption>{label}{origin}</figcaption>'
                '<p class="muted">collecting: a point is added every sampling interval while the page is watched</p>'
                "</figure>")  # fmt: skip
    t0, t1 = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1.0
    span = (t1 - t0) or 1.0
    coords = " ".join(
        f"{PAD + (t - t0) / span * (WIDTH - 2 * PAD):.1f},{HEIGHT - PAD - v / top * (HEIGHT - 2 * PAD):.1f}"
        for t, v in points
    )
    last = points[-1][1]
    return (
        f'<figure class="chart"><figcaption>{label}: <b>{_num(last)}{escape(unit)}</b> now, '
        f"max {_num(top)}{escape(unit)}, last {_span(t1 - t0)}{origin}</figcaption>"
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}" preserveAspectRatio="none">'
        f'<line x1="0" y1="{HEIGHT - PAD}" x2="{WIDTH}" y2="{HEIGHT - PAD}" class="axis"/>'
        f'<polyline points="{coords}" class="series"/></svg></figure>'
    )


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 or value == int(value) else f"{value:.2f}"


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
