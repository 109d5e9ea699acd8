"""Line charts over days as inline SVG, drawn on the server: no script, no style attribute, nothing the strict
Content-Security-Policy (docs/security.md) would have to allow. One polyline (and its points) per series, a
labelled axis each way, and a ``<title>`` per point that says its value."""

from __future__ import annotations

from datetime import date
from html import escape

PALETTE = ("#1d5fa8", "#2e7d32", "#b00020", "#8a5a00", "#6a1b9a", "#00838f", "#5d4037", "#455a64")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 640, 220, 56, 150, 14, 30


def line_chart(title: str, lines: dict[str, list[tuple[date, float]]], *, unit: str, chart_id: str) -> str:
    """An ``<svg>`` of ``lines`` (name -> [(day, value)]); a sentence instead when nothing was measured."""
    points = [p for line in lines.values() for p in line]
    if not points:
        return f'<p class="muted" id="{escape(chart_id)}">{escape(title)}: no measured calls yet.</p>'
    days = sorted({d for d, _ in points})
    low, high = min(0.0, min(v for _, v in points)), max(v for _, v in points)
    high = high if high > low else low + 1.0
    first, span = days[0].toordinal(), max(1, days[-1].toordinal() - days[0].toordinal())
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(day: date) -> float:
        return LEFT + plot_w * ((day.toordinal() - first) / span if len(days) > 1 else 0.5)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - (value - low) / (high - low))

    parts = [
        f'<svg id="{escape(chart_id)}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#888"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#888"/>',
        _text(LEFT - 4, y(high) + 4, f"{high:.3g} {unit}", anchor="end"),
        _text(LEFT - 4, y(low) + 4, f"{low:.3g} {unit}", anchor="end"),
        _text(LEFT, HEIGHT - 8, days[0].isoformat(), anchor="start"),
    ]
    if len(days) > 1:
        parts.append(_text(LEFT + plot_w, HEIGHT - 8, days[-1].isoformat(), anchor="end"))
    for i, (name, line) in enumerate(sorted(lines.items())):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{x(d):.1f},{y(v):.1f}" for d, v in line)
        parts.append(f'<g class="series" data-name="{escape(name)}">')
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        for d, v in line:
            parts.append(
                f'<circle cx="{x(d):.1f}" cy="{y(v):.1f}" r="3" fill="{color}">'
                f"<title>{escape(name)} {d.isoformat()}: {v:.3g} {escape(unit)}</title></circle>"
            )
        parts.append(_text(WIDTH - RIGHT + 8, TOP + 12 + 14 * i, name[:22], anchor="start", fill=color))
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _text(x: float, y: float, text: str, *, anchor: str, fill: str = "#555") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="11" text-anchor="{anchor}" fill="{fill}">{escape(text)}</text>'
