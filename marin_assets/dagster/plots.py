"""A small line plot as SVG, for curves in materialization metadata (no plotting library).

Dagster's UI shows markdown metadata inline only under 1000 characters (longer becomes a
"Show Markdown" button), and renders images from `data:` URIs but not inline `<svg>`: so the
plot is a compact SVG — at most `MAX_POINTS` points, integer coordinates — in a data URI.
Curves come from step results as they are: points that are not pairs of finite numbers (a NaN
loss, a string) are left out of the plot rather than failing it.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Sequence
from typing import Any, TypeVar

WIDTH, HEIGHT, PAD = 300, 110, 26
MAX_POINTS = 24
INLINE_LIMIT = 1000
"""Dagster shows markdown metadata shorter than this inline."""
MAX_TITLE_CHARS = 40
"""Longer titles are cut: they would not fit the plot, nor the markdown under `INLINE_LIMIT`."""

P = TypeVar("P")


def downsample(points: Sequence[P], n: int = MAX_POINTS) -> list[P]:
    """At most `n` points, evenly spaced, always keeping the first and the last."""
    if len(points) <= n:
        return list(points)
    return [points[round(i * (len(points) - 1) / (n - 1))] for i in range(n)]


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool, nor an int too large for a float): what can be plotted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def finite_points(points: Sequence[Any]) -> list[tuple[float, float]]:
    """The points of a curve that are `[x, y]` pairs of finite numbers, as floats; others are left out."""
    return [(float(p[0]), float(p[1])) for p in points
            if isinstance(p, (list, tuple)) and len(p) == 2 and is_number(p[0]) and is_number(p[1])]


def line_plot_svg(points: Sequence[Any], title: str = "") -> str:
    """An SVG line plot of `[x, y]` points: the line, the title, and the x and y ranges."""
    pts = downsample(finite_points(points))
    if not pts:
        raise ValueError("nothing to plot: no point is a pair of finite numbers")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    coords = " ".join(f"{PAD + _scale(x, x0, x1) * (WIDTH - 2 * PAD):.0f},"
                      f"{HEIGHT - PAD - _scale(y, y0, y1) * (HEIGHT - 2 * PAD):.0f}" for x, y in pts)
    bottom, right = HEIGHT - PAD, WIDTH - PAD
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif"'
            f' font-size="10"><path d="M{PAD} {PAD}V{bottom}H{right}" fill="none" stroke="#999"/>'
            f'<polyline points="{coords}" fill="none" stroke="#4f43dd" stroke-width="2"/>'
            f'<text x="{WIDTH // 2}" y="12" text-anchor="middle">{_escape(_short(title))}</text>'
            f'<text x="{PAD}" y="{bottom + 12}">{x0:.4g}</text>'
            f'<text x="{right}" y="{bottom + 12}" text-anchor="end">{x1:.4g}</text>'
            f'<text x="2" y="{PAD + 3}">{y1:.4g}</text><text x="2" y="{bottom}">{y0:.4g}</text></svg>')


def line_plot_markdown(points: Sequence[Any], title: str = "") -> str:
    """Markdown showing the plot as an inline image (a data URI: nothing to serve or store)."""
    svg = line_plot_svg(points, title)
    alt = re.sub(r"[\[\]\\\s]+", " ", _short(title)).strip()  # brackets or newlines would end the alt text
    return f"![{alt}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"


def _scale(v: float, lo: float, hi: float) -> float:
    """Where `v` lies between `lo` and `hi`, 0 to 1 (the middle for a flat range); halved first so that
    `hi - lo` cannot overflow."""
    span = hi / 2 - lo / 2
    return (v / 2 - lo / 2) / span if span > 0 else 0.5


def _short(title: str) -> str:
    return title if len(title) <= MAX_TITLE_CHARS else title[:MAX_TITLE_CHARS - 1] + "…"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
