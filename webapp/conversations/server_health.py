"""Whether the server keeps up with a live call, in plain words for the caller (``session.status``).

The session's once-a-second ``session.metrics`` carry counters (frames dropped, late engine ticks,
queued audio); a caller should not have to read them to learn that audio may break up. This module
turns one metrics report after another into at most one status change: ``warning`` as soon as a
report shows the server falling behind, ``ok`` again once it has kept up for a few reports (so the
line does not flicker on one good second in a bad stretch). docs/protocol.md documents the event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

BEHIND = "The server is behind: audio may break up."
CAUGHT_UP = "The server has caught up."

# A report is "behind" when, since the previous one, frames were dropped, the engine missed its tick
# deadline this many times (one late tick in a second is noise on a busy host; a stretch is not), or
# audio waits queued for this long.
LATE_TICKS_PER_REPORT = 3
# The agent's audio queued on its way out this long. Not the input queue: a backlog of the caller's speech
# stands until their next pause (the framer never cuts words), latency their audio's arrival built, which a
# server keeping its ticks would only report as behind until the caller next stops talking.
LAG_MS = 480.0
# Reports in a row without trouble before the warning is taken back.
GOOD_REPORTS_TO_CLEAR = 3


@dataclass(frozen=True)
class Status:
    """One ``session.status`` event's fields."""

    level: str  # "warning" | "ok"
    code: str  # "server_behind" | "server_caught_up"
    message: str


class ServerHealth:
    """Follows one call's metrics reports; ``update`` returns a Status when the caller should be told."""

    def __init__(self) -> None:
        self.behind = False
        self.good_reports = 0
        self.last: Mapping[str, float] | None = None

    def update(self, metrics: Mapping[str, float]) -> Status | None:
        trouble = self._trouble(metrics)
        self.last = metrics
        if trouble:
            self.good_reports = 0
            if not self.behind:
                self.behind = True
                return Status("warning", "server_behind", BEHIND)
            return None
        self.good_reports += 1
        if self.behind and self.good_reports >= GOOD_REPORTS_TO_CLEAR:
            self.behind = False
            return Status("ok", "server_caught_up", CAUGHT_UP)
        return None

    def _trouble(self, metrics: Mapping[str, float]) -> bool:
        previous = self.last or {}

        def rose(name: str) -> float:
            # Counters only grow within a session; a smaller value is a new worker or slot: count from zero.
            now, before = float(metrics.get(name, 0) or 0), float(previous.get(name, 0) or 0)
            return now - before if now >= before else now

        if self.last is None:  # the first report's counters cover the time before this socket: no baseline
            return float(metrics.get("out_lag_ms", 0) or 0) >= LAG_MS
        # Standing-queue trims are the caller's network bunching audio up, and a prefill's discards the model not
        # listening yet (the call page sends nothing then): neither is the server falling behind.
        return (
            rose("dropped_frames") - rose("trimmed_frames") - rose("prefill_dropped_frames") > 0
            or rose("late_ticks") >= LATE_TICKS_PER_REPORT
            or float(metrics.get("out_lag_ms", 0) or 0) >= LAG_MS
        )
