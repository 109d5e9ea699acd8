"""What one window of the framer's takes saw: the measures its trims and the phase advice are judged on.

The framer (``inference.audio.framing``) keeps one ``TakeWindow`` per window of ``WINDOW_TICKS`` takes and starts a
new one at each window's end; pushes and takes report here, and the window's end reads the result.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TakeWindow:
    """One window's takes and pieces.

    Attributes:
        ticks: takes so far.
        min_depth: the smallest depth left after a take (samples): the part of the FIFO that never moved.
        short: a take found less than a frame, or nothing.
        lead: the smallest lead of the newest piece over the takes (s).
        lead2: the second smallest.
        wait: the smallest wait of a take's frame end: its lead plus the depth behind it (s).
        moved: a piece of another length than the one before it: the client moved its cut.
        whole_pieces: every piece was a whole frame or more.
        from_position: the stream position of the first frame end.
    """

    ticks: int = 0
    min_depth: int = 1 << 62
    short: bool = False
    lead: float = float("inf")
    lead2: float = float("inf")
    wait: float = float("inf")
    moved: bool = False
    whole_pieces: bool = True
    from_position: int | None = None

    def piece_pushed(self, samples: int, frame_samples: int, previous_samples: int) -> None:
        """A piece of ``samples`` arrived; the one before it had ``previous_samples``."""
        if samples < frame_samples:
            self.whole_pieces = False
        if samples != previous_samples:
            self.moved = True

    def take_ended(self, depth: int, lead_s: float | None, samples_per_ms: float) -> None:
        """A take left ``depth`` samples behind its frame, the newest piece ``lead_s`` before it (None when no piece
        is known)."""
        self.min_depth = min(self.min_depth, depth)
        if lead_s is not None:
            if lead_s < self.lead:
                self.lead, self.lead2 = lead_s, self.lead
            elif lead_s < self.lead2:
                self.lead2 = lead_s
            # per take: the smallest lead and the smallest depth can come from different takes (a piece kept back
            # just before its tick, one just after it), and added up read as no wait while every frame waited a period
            self.wait = min(self.wait, lead_s + depth / samples_per_ms / 1000.0)
        self.ticks += 1
