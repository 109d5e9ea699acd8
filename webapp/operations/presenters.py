"""Turn ``WorkerSnapshot``s into what the occupancy templates and the JSON endpoint show.

Kept apart from the views so the SVG geometry and the JSON shape can be read (and tested)
without a request.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

from inference.contracts import WorkerSnapshot

CHART_WIDTH = 480
CHART_HEIGHT = 120
CHART_PAD_LEFT = 34  # room for the y-axis labels
CHART_PAD_TOP = 8
CHART_PAD_BOTTOM = 8  # room below the zero line for its label


@dataclass(frozen=True)
class TickChart:
    """An SVG line chart of recent tick times; coordinates are precomputed for the template."""

    width: int
    height: int
    left: int  # x where the plot starts (after the y-axis labels)
    points: str  # "x,y x,y ..." for <polyline>
    y_max_ms: float
    budget_y: float | None  # y of the engine's real-time budget line (chunk period), if within the chart
    budget_ms: float | None
    gridlines: tuple[tuple[float, str], ...]  # (y, label)
    empty: bool


def tick_chart(recent_ms: tuple[float, ...], *, budget_ms: float | None = None) -> TickChart:
    """Scale the recent tick times into the chart box; the y axis starts at 0 so heights compare."""
    values = [v for v in recent_ms if v >= 0]
    top = _nice_ceil(max([*values, budget_ms or 0.0, 1.0]))
    plot_w = CHART_WIDTH - CHART_PAD_LEFT
    plot_h = CHART_HEIGHT - CHART_PAD_TOP - CHART_PAD_BOTTOM

    def y_of(ms: float) -> float:
        return round(CHART_PAD_TOP + plot_h * (1 - min(ms, top) / top), 1)

    step = plot_w / max(1, len(values) - 1)
    points = " ".join(f"{round(CHART_PAD_LEFT + i * step, 1)},{y_of(v)}" for i, v in enumerate(values))
    grid = tuple((y_of(top * f), f"{top * f:g}") for f in (0.0, 0.5, 1.0))
    return TickChart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        left=CHART_PAD_LEFT,
        points=points,
        y_max_ms=top,
        budget_y=y_of(budget_ms) if budget_ms else None,
        budget_ms=budget_ms,
        gridlines=grid,
        empty=not values,
    )


def worker_rows(
    snapshots: list[WorkerSnapshot],
    *,
    budgets_ms: dict[str, float] | None = None,
    usernames: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One template row per worker: the snapshot, its slots with user names, counts per state, its tick chart."""
    rows = []
    for snap in snapshots:
        counts = Counter(slot.state for slot in snap.slots)
        budget = (budgets_ms or {}).get(snap.engine)
        rows.append(
            {
                "snapshot": snap,
                "slots": [
                    {"slot": slot, "username": (usernames or {}).get(slot.user_key or "", slot.user_key)}
                    for slot in snap.slots
                ],
                "busy": snap.num_slots - counts.get("free", 0),
                "counts": sorted(counts.items()),
                "chart": tick_chart(snap.recent_tick_ms, budget_ms=budget),
                "memory": [(name, _bytes(value)) for name, value in sorted(snap.memory.items())],
            }
        )
    return rows


def occupancy_payload(snapshots: list[WorkerSnapshot]) -> dict[str, Any]:
    """The JSON document of /ops/occupancy.json (plain dataclass fields, tuples as lists)."""
    workers = [dataclasses.asdict(s) for s in snapshots]
    live = [slot for s in snapshots for slot in s.slots if slot.state != "free"]
    return {
        "workers": workers,
        "total_slots": sum(s.num_slots for s in snapshots),
        "busy_slots": len(live),
        "queue_length": sum(s.queue_length for s in snapshots),
        "session_ids": sorted(slot.session_id for slot in live if slot.session_id),
    }


def _nice_ceil(value: float) -> float:
    """The next 1/2/2.5/5 x 10^k at or above ``value``: round axis labels."""
    magnitude = 10.0 ** (len(str(int(value))) - 1) if value >= 1 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= value:
            return m * magnitude
    return 10 * magnitude


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
