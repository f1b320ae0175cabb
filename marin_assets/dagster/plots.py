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
from dataclasses import dataclass
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


def _short(text: str, limit: int = MAX_TITLE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --- several series on one plot (an experiment summary) ------------------------------------------
#
# Only the lines are drawn in the image, on a small integer grid (a viewBox scaled up by the browser): the
# title, the legend and the axis ranges are markdown text beside it, which costs a character where the
# base64 image would cost a third more. The legend's colored squares are emoji whose colors the lines use.

COLORS = ("#38c", "#d34", "#7b5", "#ec5", "#a8d", "#c64", "#f90", "#334")
"""One color per series, each an emoji square's (`SQUARES`); more series than colors are left out of the
plot (the table has them all)."""
SQUARES = ("\U0001F7E6", "\U0001F7E5", "\U0001F7E9", "\U0001F7E8", "\U0001F7EA", "\U0001F7EB", "\U0001F7E7",
           "\u2B1B")
"""Blue, red, green, yellow, purple, brown, orange and black squares: the legend."""
MAX_SERIES = len(COLORS)
MAX_SERIES_POINTS = 24
"""Per series: a plot of several series is bounded by `MAX_SERIES` × this many points."""
MIN_SERIES_POINTS = 4
"""Per series, fewer points are not cut to keep the markdown under `INLINE_LIMIT` (it is then shown
behind Dagster's "Show Markdown" button, bounded all the same)."""
MAX_LABEL_CHARS = 14
"""Per series in the legend."""
SERIES_WIDTH, SERIES_HEIGHT = 360, 130
"""Pixels the plot takes on the page."""
GRID_X, GRID_Y = 99, 71
"""Its coordinates: integers from 0 to these, stretched to the pixels (two digits a coordinate)."""


def is_series_plot(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """The shape of a plot of several series (`experiment_summary.PlotData` as JSON): a title, whether x is
    logarithmic, and series label → `[x, y]` points. Optional: `log_y`, `connect`, `order` (the labels in legend
    order: a record's mappings come back with their keys sorted), and drawn in a series' color beside (or instead
    of) its line, `markers` (label → points drawn as dots) and `parabolas` (label → three points a parabola
    passes through): `scaling_analysis.ScalingPlot`."""
    return (isinstance(value, Mapping) and {"title", "log_x", "series"} <= set(value)
            and isinstance(value["series"], Mapping)
            and all(isinstance(points, list) for points in value["series"].values())
            and all(_is_points_by_label(value.get(k) or {}) for k in ("markers", "parabolas")))


def _is_points_by_label(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(points, list) for points in value.values())


@dataclass(frozen=True)
class SeriesPlot:
    """A plot of several series, drawn: the image (lines only) and the text that goes with it."""

    svg: str
    """The lines, one `<path>` per series in `COLORS` order, on the `GRID_X` × `GRID_Y` grid."""
    labels: tuple[str, ...]
    """The series shown, in order (cut to `MAX_LABEL_CHARS`)."""
    x_range: tuple[float, float]
    """The lowest and highest x shown."""
    y_range: tuple[float, float]
    """The lowest and highest y shown."""


def series_plot(series: Mapping[str, Sequence[Any]], log_x: bool = False, connect: bool = True,
                points_per_series: int = MAX_SERIES_POINTS, *, log_y: bool = False,
                markers: Mapping[str, Sequence[Any]] | None = None,
                parabolas: Mapping[str, Sequence[Any]] | None = None, order: Sequence[str] = ()) -> SeriesPlot:
    """Draw several series of `[x, y]` points, one color each.

    `log_x` / `log_y` space x / y by their logarithm (learning rates; power laws, straight on log–log);
    `connect=False` draws points instead of lines; series with no plottable point, and those after the first
    `MAX_SERIES`, are left out. A label may also have `markers` (its points drawn as dots, never thinned: they
    are data) and a parabola (`parabolas`: three points, the middle one midway in plotted x, drawn as the exact
    parabola through them in the plot's coordinates — one quadratic Bézier, however many points it would take
    as a line — with a short vertical tick at its vertex when that lies between its ends); they take the color
    of its series. `order`: labels in the order to draw and list them (others follow in their own order)."""
    markers, parabolas = markers or {}, parabolas or {}

    def usable(points: Sequence[Any]) -> list[tuple[float, float]]:
        return [p for p in finite_points(points) if (not log_x or p[0] > 0) and (not log_y or p[1] > 0)]

    given = [*series, *parabolas, *markers]
    labels = list(dict.fromkeys([*(label for label in order if label in given), *given]))[:MAX_SERIES]
    lines: dict[str, list[tuple[float, float]]] = {}
    curves: dict[str, list[tuple[float, float]]] = {}
    dots: dict[str, list[tuple[float, float]]] = {}
    for label in labels:
        if label in series and (pts := usable(series[label])):
            lines[str(label)] = downsample(sorted(pts), min(points_per_series, MAX_SERIES_POINTS))
        if label in parabolas and len(pts := usable(parabolas[label])) == 3:
            curves[str(label)] = sorted(pts)
        if label in markers and (pts := usable(markers[label])):
            dots[str(label)] = sorted(pts)
    shown = list(dict.fromkeys(str(label) for label in labels if str(label) in {*lines, *curves, *dots}))
    if not shown:
        raise ValueError("nothing to plot: no series has a point that is a pair of finite numbers")

    def fx(x: float) -> float:
        return math.log10(x) if log_x else x

    def fy(y: float) -> float:
        return math.log10(y) if log_y else y

    xs = [fx(x) for group in (lines, curves, dots) for pts in group.values() for x, _ in pts]
    ys = [fy(y) for group in (lines, curves, dots) for pts in group.values() for _, y in pts]
    ys += [y for pts in curves.values() for y in _parabola_extremum([(fx(x), fy(y)) for x, y in pts])]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)

    def grid(x: float, y: float) -> str:
        return f"{_scale(fx(x), x0, x1) * GRID_X:.0f} {GRID_Y - _scale(fy(y), y0, y1) * GRID_Y:.0f}"

    paths, marks = [], []
    for color, label in zip(COLORS, shown, strict=False):
        if label in lines:
            coords = [grid(x, y) for x, y in lines[label]]
            if connect and len(coords) > 1:
                paths.append(f'<path stroke="{color}" d="M{" ".join(coords)}"/>')
            else:  # a dot per point: a zero-length segment with round caps (inline style: see `dotted`)
                paths.append(f'<path stroke="{color}" style="stroke-width:5;stroke-linecap:round" d="'
                             f'{"".join(f"M{c}h0" for c in coords)}"/>')
        if label in curves:
            paths.append(f'<path stroke="{color}" d="{_parabola_path(curves[label], grid)}"/>')
        if label in dots:
            marks.append(f'<path stroke="{color}" d="{"".join(f"M{grid(x, y)}h0" for x, y in dots[label])}"/>')
    # Markers go in one group whose paths the stylesheet makes wide and round (a stylesheet rule overrides
    # presentation attributes: `stroke-width="5"` on a path is drawn 2 wide); an inline plot is counted in
    # characters, and one rule is shorter than an attribute per path.
    dotted = "g path{stroke-width:5;stroke-linecap:round}" if marks else ""
    if marks:
        paths.append(f'<g>{"".join(marks)}</g>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{SERIES_WIDTH}" height="{SERIES_HEIGHT}" viewBox="-2 -2'
           f' {GRID_X + 4} {GRID_Y + 4}" preserveAspectRatio="none"><style>path{{vector-effect:non-scaling-stroke;'
           f'fill:none;stroke-width:2}}{dotted}</style><path stroke="#bbb" d="M-1 -2V{GRID_Y + 1}'
           f'H{GRID_X + 2}"/>{"".join(paths)}</svg>')
    labels_shown = tuple(_short(label, MAX_LABEL_CHARS) for label in shown)
    return SeriesPlot(svg, labels_shown, (10 ** x0, 10 ** x1) if log_x else (x0, x1),
                      (10 ** y0, 10 ** y1) if log_y else (y0, y1))


def _vertex(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """The vertex of the parabola through three points (x0 < xm = midpoint < x2) when it lies between x0 and x2 —
    the curve's lowest or highest point, which the plot's range must hold and a tick marks; None otherwise."""
    (xa, ya), (xm, ym), (xb, yb) = points
    control = 2 * ym - (ya + yb) / 2  # the quadratic Bézier's control point, in y (in x it is xm)
    bend = ya - 2 * control + yb
    t = (ya - control) / bend if bend else -1.0
    if not 0 < t < 1:
        return None
    return (1 - t) * xa + t * xb, (1 - t) ** 2 * ya + 2 * t * (1 - t) * control + t * t * yb


def _parabola_extremum(points: Sequence[tuple[float, float]]) -> list[float]:
    """The y of the vertex (`_vertex`), if any."""
    vertex = _vertex(points)
    return [] if vertex is None else [vertex[1]]


TICK = 6
"""Height of the tick at a parabola's vertex, in grid units."""


def _parabola_path(points: Sequence[tuple[float, float]], grid: Any) -> str:
    """The parabola through three points as one quadratic Bézier: from the first to the last, its control point
    2·middle − (first + last)/2 (exact when the middle point is midway in plotted x); and a tick at its vertex."""
    corners: list[tuple[float, float]] = []
    for x, y in points:
        gx, gy = grid(x, y).split()
        corners.append((float(gx), float(gy)))
    (xa, ya), (xm, ym), (xb, yb) = corners
    path = f"M{xa:.0f} {ya:.0f}Q{2 * xm - (xa + xb) / 2:.0f} {2 * ym - (ya + yb) / 2:.0f} {xb:.0f} {yb:.0f}"
    vertex = _vertex(corners)
    return path if vertex is None else f"{path}M{vertex[0]:.0f} {vertex[1] - TICK / 2:.0f}v{TICK}"


def series_plot_markdown(plot: Mapping[str, Any]) -> str:
    """Markdown showing a plot of several series (`is_series_plot`): the lines as an inline image (a data URI),
    then the title, the legend and the ranges as text — with as many points per series as keep it under
    `INLINE_LIMIT`, so that Dagster shows it inline, but never fewer than `MIN_SERIES_POINTS`."""
    title = _short(str(plot.get("title") or ""))
    alt = re.sub(r"[\[\]\\\s]+", " ", title).strip()
    markdown = ""
    for n in range(MAX_SERIES_POINTS, MIN_SERIES_POINTS - 1, -1):
        drawn = series_plot(plot["series"], bool(plot.get("log_x")), bool(plot.get("connect", True)), n,
                            log_y=bool(plot.get("log_y")), markers=plot.get("markers"),
                            parabolas=plot.get("parabolas"), order=[str(v) for v in plot.get("order") or ()])
        legend = " ".join(f"{square} {_escape_markdown(label)}" for square, label in zip(SQUARES, drawn.labels,
                                                                                          strict=False))
        (xa, xb), (ya, yb) = drawn.x_range, drawn.y_range
        log = " (log)" if plot.get("log_x") else ""
        log_y = " (log)" if plot.get("log_y") else ""
        caption = f"{_escape_markdown(title)}: {legend}\n\nx {xa:.3g}–{xb:.3g}{log}, y {ya:.4g}–{yb:.4g}{log_y}"
        image = f"(data:image/svg+xml;base64,{base64.b64encode(drawn.svg.encode()).decode()})\n\n"
        markdown = f"![{alt}]{image}{caption}"
        if inline_length(markdown) < INLINE_LIMIT:
            break
        if n == MIN_SERIES_POINTS and inline_length(f"![]{image}{caption}") < INLINE_LIMIT:
            markdown = f"![]{image}{caption}"  # the title is in the caption: without it as alt text, still inline
    return markdown


def inline_length(markdown: str) -> int:
    """The length Dagster's UI compares with `INLINE_LIMIT`: JavaScript's, in UTF-16 code units (the legend's
    colored squares count two each)."""
    return len(markdown.encode("utf-16-le")) // 2


def _escape_markdown(text: str) -> str:
    """Text that markdown shows as it is (labels and titles are run names, learning rates, sizes)."""
    return re.sub(r"([\\`*_\[\]<>|~])", r"\\\1", text)
