"""A small line plot as SVG, for curves in materialization metadata (no plotting library)."""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence

WIDTH, HEIGHT, PAD = 480, 220, 40


def line_plot_svg(points: Sequence[Sequence[float]], title: str = "", x_label: str = "step") -> str:
    """An SVG line plot of `[x, y]` points with axis ticks at the ends and the title on top."""
    pts = [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    if not pts:
        raise ValueError("nothing to plot")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (WIDTH - 2 * PAD)

    def sy(y: float) -> float:
        return HEIGHT - PAD - (y - y0) / (y1 - y0) * (HEIGHT - 2 * PAD)

    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(pts))
    text = 'font-family="sans-serif" font-size="11" fill="#444"'
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
        f'<path d="{path}" fill="none" stroke="#4f43dd" stroke-width="2"/>'
        f'<text x="{WIDTH / 2}" y="{PAD / 2}" text-anchor="middle" {text} font-size="13">{_escape(title)}</text>'
        f'<text x="{PAD}" y="{HEIGHT - PAD + 15}" text-anchor="middle" {text}>{_num(x0)}</text>'
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 15}" text-anchor="middle" {text}>{_num(x1)}</text>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle" {text}>{_escape(x_label)}</text>'
        f'<text x="{PAD - 4}" y="{sy(y1) + 4:.1f}" text-anchor="end" {text}>{_num(y1)}</text>'
        f'<text x="{PAD - 4}" y="{sy(y0) + 4:.1f}" text-anchor="end" {text}>{_num(y0)}</text>'
        "</svg>"
    )


def line_plot_markdown(points: Sequence[Sequence[float]], title: str = "") -> str:
    """Markdown showing the plot as an inline image (a data URI: nothing to serve or store)."""
    svg = line_plot_svg(points, title)
    return f"![{title}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"


def _num(value: float) -> str:
    return f"{value:.4g}"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
