"""Turn-taking and echo measures of recorded calls, aggregated per persona, voice, checkpoint or engine, and per
day for the charts (the staff dashboard, ``/ops/measures/``).

The measures live on each ``Recording`` as JSON (``turn_taking``, ``echo_leak``, written by post-processing);
they are read for the latest ``MAX_CALLS`` measured calls and summed up here in Python, the same on SQLite and
PostgreSQL. A call whose measurement failed (``{"error": ...}``) counts in no mean.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from statistics import mean
from typing import Any

from webapp.recordings.models import Recording

MAX_CALLS = 5000
DIMENSIONS = {"persona": "Persona", "voice": "Voice", "checkpoint": "Checkpoint", "engine": "Engine"}


@dataclass
class Group:
    """One persona's (voice's, ...) calls, summed up."""

    name: str
    calls: int = 0
    latencies: list[float] = field(default_factory=list)  # each call's mean response latency (s)
    overlaps_per_min: list[float] = field(default_factory=list)
    yielded: int = 0
    interruptions: int = 0
    talk_ratios: list[float] = field(default_factory=list)
    echo_measured: int = 0
    echo_flagged: int = 0
    leaks_db: list[float] = field(default_factory=list)

    def add(self, turn_taking: dict[str, Any], echo: dict[str, Any], minutes: float) -> None:
        self.calls += 1
        if turn_taking and "error" not in turn_taking:
            if turn_taking.get("response_latency_mean_s") is not None:
                self.latencies.append(turn_taking["response_latency_mean_s"])
            if minutes > 0:
                self.overlaps_per_min.append(len(turn_taking.get("overlaps", [])) / minutes)
            self.yielded += int(turn_taking.get("interruptions_yielded", 0))
            self.interruptions += len(turn_taking.get("interruptions", []))
            if turn_taking.get("talk_ratio") is not None:
                self.talk_ratios.append(turn_taking["talk_ratio"])
        if echo and "error" not in echo:
            self.echo_measured += 1
            if echo.get("flagged"):
                self.echo_flagged += 1
                if echo.get("leak_db") is not None:
                    self.leaks_db.append(echo["leak_db"])

    @property
    def row(self) -> dict[str, Any]:
        """The dashboard table's cells (None where nothing was measured)."""
        return {
            "name": self.name,
            "calls": self.calls,
            "latency_s": _mean(self.latencies),
            "overlaps_per_min": _mean(self.overlaps_per_min),
            "yielded": f"{self.yielded} of {self.interruptions}" if self.interruptions else None,
            "talk_ratio": _mean(self.talk_ratios),
            "echo_share": round(self.echo_flagged / self.echo_measured, 3) if self.echo_measured else None,
            "echo_flagged": self.echo_flagged,
            "leak_db": _mean(self.leaks_db),
        }


def measured_calls() -> Iterable[Recording]:
    """The latest measured calls, everyone's (the dashboard is staff only)."""
    rows = Recording.objects.exclude(turn_taking={}).order_by("-started_at")
    fields = ("persona_name", "voice", "checkpoint", "engine", "started_at", "duration_s", "turn_taking", "echo_leak")
    return rows.only(*fields)[:MAX_CALLS]


def key_of(recording: Recording, dimension: str) -> str:
    value = {
        "persona": recording.persona_name,
        "voice": recording.voice,
        "checkpoint": recording.checkpoint_name,
        "engine": recording.engine,
    }[dimension]
    return value or "(none)"


def aggregate(calls: Iterable[Recording], dimension: str) -> tuple[list[dict[str, Any]], dict[str, dict[date, Group]]]:
    """The table's rows by ``dimension``, and each group's calls per day (for the charts)."""
    groups: dict[str, Group] = {}
    daily: dict[str, dict[date, Group]] = defaultdict(dict)
    for call in calls:
        name = key_of(call, dimension)
        minutes = (call.duration_s or 0.0) / 60.0
        day = call.started_at.date()
        for group in (groups.setdefault(name, Group(name)), daily[name].setdefault(day, Group(name))):
            group.add(call.turn_taking or {}, call.echo_leak or {}, minutes)
    rows = sorted((g.row for g in groups.values()), key=lambda r: (-r["calls"], r["name"]))
    return rows, daily


def series(daily: dict[str, dict[date, Group]], metric: str) -> dict[str, list[tuple[date, float]]]:
    """One line per group: (day, the day's value of ``metric``, a key of ``Group.row``), days with a value."""
    lines = {}
    for name, days in daily.items():
        points = [(day, days[day].row[metric]) for day in sorted(days)]
        lines[name] = [(day, float(value)) for day, value in points if isinstance(value, int | float)]
    return {name: points for name, points in lines.items() if points}


def _mean(values: list[float]) -> float | None:
    return round(mean(values), 3) if values else None
