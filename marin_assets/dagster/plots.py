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
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard, TypeVar

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


# --- several series on one plot (an experiment summary) ------------------------------------------

COLORS = ("#43d", "#e52", "#1a9", "#ea1", "#825", "#28a", "#694", "#333")
"""One color per series; more series than colors are left out of the plot (the table has them all)."""
MAX_SERIES = len(COLORS)
MAX_SERIES_POINTS = 12
"""Per series: a plot of several series is bounded by `MAX_SERIES` × this many points."""
MIN_SERIES_POINTS = 4
"""Per series, fewer points are not cut to keep the markdown under `INLINE_LIMIT` (it is then shown
behind Dagster's "Show Markdown" button, bounded all the same)."""
MAX_LABEL_CHARS = 14
"""Per series in the legend."""
SERIES_WIDTH, SERIES_HEIGHT = 360, 130


def is_series_plot(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """The shape of a plot of several series (`experiment_summary.PlotData` as JSON): a title, whether x is
    logarithmic, and series label → `[x, y]` points."""
    return (isinstance(value, Mapping) and {"title", "log_x", "series"} <= set(value)
            and isinstance(value["series"], Mapping)
            and all(isinstance(points, list) for points in value["series"].values()))


def series_plot_svg(series: Mapping[str, Sequence[Any]], title: str = "", log_x: bool = False,
                    connect: bool = True, points_per_series: int = MAX_SERIES_POINTS) -> str:
    """An SVG plot of several series of `[x, y]` points, one color each, a legend, and the x and y ranges.

    `log_x` spaces x by its logarithm (learning rates); series with no plottable point, and those after the
    first `MAX_SERIES`, are left out."""
    shown: dict[str, list[tuple[float, float]]] = {}
    for label, points in list(series.items())[:MAX_SERIES]:
        pts = [p for p in finite_points(points) if not log_x or p[0] > 0]
        if pts:
            shown[str(label)] = downsample(sorted(pts), min(points_per_series, MAX_SERIES_POINTS))
    if not shown:
        raise ValueError("nothing to plot: no series has a point that is a pair of finite numbers")

    def fx(x: float) -> float:
        return math.log10(x) if log_x else x

    xs = [fx(x) for pts in shown.values() for x, _ in pts]
    ys = [y for pts in shown.values() for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    w, h, legend = SERIES_WIDTH, SERIES_HEIGHT, 100
    right, bottom = w - legend, h - PAD
    parts = []
    for i, (label, pts) in enumerate(shown.items()):
        coords = " ".join(f"{PAD + _scale(fx(x), x0, x1) * (right - PAD):.0f},"
                          f"{bottom - _scale(y, y0, y1) * (bottom - PAD):.0f}" for x, y in pts)
        color = COLORS[i]
        if connect and len(pts) > 1:
            parts.append(f'<polyline points="{coords}" stroke="{color}"/>')
        else:
            parts.extend(f'<circle cx="{c.split(",")[0]}" cy="{c.split(",")[1]}" r="2" fill="{color}"/>'
                         for c in coords.split())
        name = label if len(label) <= MAX_LABEL_CHARS else label[:MAX_LABEL_CHARS - 1] + "…"
        parts.append(f'<text x="{right + 6}" y="{PAD + 12 * i + 3}" fill="{color}">{_escape(name)}</text>')
    x_low, x_high = (10 ** x0, 10 ** x1) if log_x else (x0, x1)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif"'
            f' font-size="10"><g fill="none" stroke-width="2"><path d="M{PAD} {PAD}V{bottom}H{right}" stroke="#999"/>'
            f'{"".join(p for p in parts if p.startswith("<polyline"))}</g>'
            f'{"".join(p for p in parts if not p.startswith("<polyline"))}'
            f'<text x="{PAD}" y="12">{_escape(_short(title))}</text>'
            f'<text x="{PAD}" y="{bottom + 12}">{x_low:.4g}</text>'
            f'<text x="{right}" y="{bottom + 12}" text-anchor="end">{x_high:.4g}{" (log)" if log_x else ""}</text>'
            f'<text x="2" y="{PAD + 3}">{y1:.4g}</text><text x="2" y="{bottom}">{y0:.4g}</text></svg>')


def series_plot_markdown(plot: Mapping[str, Any]) -> str:
    """Markdown showing a plot of several series (`is_series_plot`) as an inline image (a data URI): with as
    many points per series as keep it under `INLINE_LIMIT`, so that Dagster shows it inline, but never fewer
    than `MIN_SERIES_POINTS`."""
    title = str(plot.get("title") or "")
    alt = re.sub(r"[\[\]\\\s]+", " ", _short(title)).strip()
    markdown = ""
    for n in range(MAX_SERIES_POINTS, MIN_SERIES_POINTS - 1, -1):
        svg = series_plot_svg(plot["series"], title, bool(plot.get("log_x")), bool(plot.get("connect", True)), n)
        markdown = f"![{alt}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"
        if len(markdown) < INLINE_LIMIT:
            break
    return markdown
