"""A small line plot as SVG, for curves in materialization metadata (no plotting library).

Dagster's UI shows markdown metadata inline only under 1000 characters (longer becomes a
"Show Markdown" button), and renders images from `data:` URIs but not inline `<svg>`: so the
plot is a compact SVG — at most `MAX_POINTS` points, integer coordinates — in a data URI.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence

WIDTH, HEIGHT, PAD = 300, 110, 26
MAX_POINTS = 24
INLINE_LIMIT = 1000
"""Dagster shows markdown metadata shorter than this inline."""


def downsample(points: Sequence[tuple[float, float]], n: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most `n` points, evenly spaced, always keeping the first and the last."""
    if len(points) <= n:
        return list(points)
    return [points[round(i * (len(points) - 1) / (n - 1))] for i in range(n)]


def line_plot_svg(points: Sequence[Sequence[float]], title: str = "") -> str:
    """An SVG line plot of `[x, y]` points: the line, the title, and the x and y ranges."""
    pts = downsample([(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)])
    if not pts:
        raise ValueError("nothing to plot")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1e-12)
    y0, y1 = min(ys), max(max(ys), min(ys) + 1e-12)
    coords = " ".join(f"{PAD + (x - x0) / (x1 - x0) * (WIDTH - 2 * PAD):.0f},"
                      f"{HEIGHT - PAD - (y - y0) / (y1 - y0) * (HEIGHT - 2 * PAD):.0f}" for x, y in pts)
    bottom, right = HEIGHT - PAD, WIDTH - PAD
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif"'
            f' font-size="10"><path d="M{PAD} {PAD}V{bottom}H{right}" fill="none" stroke="#999"/>'
            f'<polyline points="{coords}" fill="none" stroke="#4f43dd" stroke-width="2"/>'
            f'<text x="{WIDTH // 2}" y="12" text-anchor="middle">{_escape(title)}</text>'
            f'<text x="{PAD}" y="{bottom + 12}">{x0:.4g}</text>'
            f'<text x="{right}" y="{bottom + 12}" text-anchor="end">{x1:.4g}</text>'
            f'<text x="2" y="{PAD + 3}">{y1:.4g}</text><text x="2" y="{bottom}">{y0:.4g}</text></svg>')


def line_plot_markdown(points: Sequence[Sequence[float]], title: str = "") -> str:
    """Markdown showing the plot as an inline image (a data URI: nothing to serve or store)."""
    svg = line_plot_svg(points, title)
    return f"![{title}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
