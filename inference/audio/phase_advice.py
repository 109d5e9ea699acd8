"""The phase advice: where a client of whole pieces should cut them so each lands just before its tick.

A client that sends whole pieces (80 ms frames, say) decides by where it cuts them how long the frame's end waits for
its tick: 0 to a whole period, fixed for the call by its phase against the tick; and once a piece that lands just
before its tick comes after it, the frames after it stand a whole period more. The framer
(``inference.audio.framing``) can cut frames only at piece ends (a frame ending inside a piece holds that piece's
start back), so only the client can move that phase. Once a window of takes, the framer hands this module what it
saw and passes the advice on (``session.metrics``' ``input_shift_ms``, docs/protocol.md).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# A client is asked to land its pieces this much beyond the margin before the tick, and only to move by 3 ms or
# more. 3 ms beyond it, callers of 80 ms frames at 20 lines on the 2-core dev box had 2.3 % of their frames come
# after their tick and stand a period (server-added p99 87 ms); 10 ms, 0-0.2 % (12-14).
ADVICE_SAFETY_MS = 10.0
ADVICE_MIN_MS = 3.0
# The advice aims past the highest the margin grew to (for late audio) in the last this many windows (~20 s), not
# its current value: the margin gives back its excess within seconds of calm, and a client moved that close to the
# tick again meets the next late piece.
ADVICE_MEMORY_WINDOWS = 20
# A move that lands pieces closer to their tick only after this many windows (~1 min) with no late piece: where late
# pieces recur, each such move met the next one (a tick without the caller's audio). At 120 callers on the 2-core dev
# box, with the loop 20-35 ms late, callers advised either way had 75 % more of those than callers not advised.
ADVICE_CALM_WINDOWS = 60
# Once this many windows measured the pieces' spread (how much later than the window's earliest-landing piece its
# latest one landed, a piece after its tick counted by how late it came), the goal is the spread's 95th percentile
# over the last ADVICE_SPREAD_WINDOWS (~1 min) plus ADVICE_SAFETY_MS, in place of the margin's peaks and the calm.
# The margin follows the latest late piece: a follower kept 45-77 ms from its tick under the 2-core host's jitter,
# whose 99th percentile is 34 ms. In the framing simulation (bench/framing_jitter.py) the spread's 95th percentile
# took followers' frames a tick later 0.021 -> 0.007 (quiet) and 0.029 -> 0.020 (speech), their wait 62.8 -> 54.9
# and 63.2 -> 56.2 ms; the 90th, 0.009 / 0.033 at 49.9 / 51.9 ms (more late frames in speech); the 85th, 0.021 /
# 0.056 at 46.0 / 49.1 ms.
ADVICE_SPREAD_WINDOWS = 60
ADVICE_SPREAD_MIN_WINDOWS = 20
ADVICE_SPREAD_QUANTILE = 0.95  # nearest rank: of 20 windows, the second highest


@dataclass(frozen=True)
class WindowSpread:
    """How far apart a window's pieces landed before their ticks: the jitter the goal allows for.

    Attributes:
        lead_max_ms: the largest lead of a take's newest piece (-inf when no take found one).
        late_ms: how late after its tick the latest piece that missed one came (0 when none did).
        moved: a piece of the window was cut to another length than the one before (the client's move, or a
            burst): its leads are two phases, not jitter.
    """

    lead_max_ms: float
    late_ms: float
    moved: bool


@dataclass(frozen=True)
class PhaseAdvice:
    """How the client should move where it cuts its audio pieces, measured over one window of takes.

    Cutting the next piece ``shift_ms`` longer (shorter when negative) lands the pieces after it just the margin
    (plus ``ADVICE_SAFETY_MS``) before their tick; the framer then trims the standing audio that frees, as it trims
    any, when it is quiet. No sample is captured later for it: only the piece boundaries move.

    Attributes:
        shift_ms: the move, in [-period/2, period/2] the nearer way round, up to a period when a shorter piece
            would leave a tick without a whole frame (but for pieces inside the goal shorter all the same: the
            framer pads that tick once); 0 when the pieces already land within ``ADVICE_MIN_MS`` of the goal or
            closer to the tick, or, before the spread is measured, when the move would land them closer within
            ``ADVICE_CALM_WINDOWS`` of a late piece.
        from_position: the stream position of the window's first frame end: advice measured on audio the client
            sent before its latest move is stale, and a client skips it.
    """

    shift_ms: float
    from_position: int


class PhaseAdviser:
    """One stream's advice, window by window, and the memory of its late pieces that keeps the advice safe.

    Args:
        period_ms: the engine frame's length: moves are taken modulo it.
        floor_ms: the framer's margin at its floor: no goal lands pieces closer to the tick than that (plus
            ``ADVICE_SAFETY_MS``), whatever the spread.
    """

    def __init__(self, period_ms: float, *, floor_ms: float):
        self.period_ms, self.floor_ms = period_ms, floor_ms
        self.reset()

    def reset(self) -> None:
        """A new stream: no window seen, no late piece remembered."""
        self._windows = 0  # windows ended
        self._margin_peaks: deque[tuple[int, float]] = deque()  # (window, margin ms) just after each growth
        self._late_window = -ADVICE_CALM_WINDOWS  # the window of the latest growth for late audio
        # A shorter piece asked for leaves one take short by the move (the client's, not late audio) if the client
        # follows within a few windows: how far (ms, with 2 ms of slack), and for how many more window ends
        self.move_short_ms, self._move_windows = 0.0, 0
        self._spreads: deque[float] = deque(maxlen=ADVICE_SPREAD_WINDOWS)  # ms, one per window without a move

    def move_taken(self) -> None:
        """The framer met the short take a shorter piece asked for: the move is done."""
        self.move_short_ms = 0.0

    def spread_goal_ms(self) -> float | None:
        """The goal taken from the pieces' spread, or None until ``ADVICE_SPREAD_MIN_WINDOWS`` measured it."""
        if len(self._spreads) < ADVICE_SPREAD_MIN_WINDOWS:
            return None
        quantile = sorted(self._spreads)[math.ceil(ADVICE_SPREAD_QUANTILE * len(self._spreads)) - 1]  # nearest rank
        # at most the safety twice short of a period: pieces landing nearly a period before their tick are a whole
        # piece back for the slightest jitter
        return min(max(quantile, self.floor_ms) + ADVICE_SAFETY_MS, self.period_ms - 2 * ADVICE_SAFETY_MS)

    def margin_grew(self, margin_ms: float) -> None:
        """The framer's margin grew to ``margin_ms`` for late audio (a short take, or a whole piece after its tick)."""
        self._margin_peaks.append((self._windows, margin_ms))

    def window_ended(
        self,
        *,
        lead_ms: float,
        wait_ms: float,
        standing_ms: float,
        margin_ms: float,
        from_position: int | None,
        spread: WindowSpread | None = None,
    ) -> PhaseAdvice | None:
        """The advice of a window that just ended, or None when it measured nothing (no take, no piece).

        A frame's end waited the newest piece's lead plus the depth left standing behind the frame: ``wait_ms`` is
        the window's smallest such wait, take by take, ``lead_ms`` its smallest lead and ``standing_ms`` its
        smallest depth (all without the trim the window's end decided, which goes anyway); the goal is the margin
        plus ``ADVICE_SAFETY_MS``. Only a trim of standing audio brings the wait down (the engine hears real time
        at real time), so the move only lands the newest piece's end that long before its tick, and the framer's
        trims then free the rest: the move is the lead beyond the goal, modulo the period, the nearer way round
        unless a shorter piece would leave less than a frame for its tick (a padded take). The goal's margin is the
        highest it grew to for late audio in the last ``ADVICE_MEMORY_WINDOWS``, and no move closer to the tick is
        asked for until ``ADVICE_CALM_WINDOWS`` have passed without a late piece. A wait already within ``ADVICE_MIN_MS`` of the goal, or under it, asks for no
        move (a lead inside the margin with no late piece yet), except in a window where a piece came late: then
        the move further is asked for even with nothing standing (the framer trims a late piece's backlog at once).

        Once ``spread`` has been measured over ``ADVICE_SPREAD_MIN_WINDOWS`` windows without a move, the goal is
        ``spread_goal_ms`` instead, for the window's earliest-landing piece (``spread.lead_max_ms``; its wait the
        window's smallest plus the spread of its leads): the spread's memory stands for the margin's peaks and the
        calm, pieces inside the goal are moved further whether a piece of this window came late or not, and a late
        piece moves them only as far as it raises the spread's percentile.
        """
        if spread is not None and not spread.moved and spread.lead_max_ms != float("-inf") and lead_ms != float("inf"):
            latest_ms = -spread.late_ms if spread.late_ms > 0 else lead_ms  # a piece after its tick: a negative lead
            self._spreads.append(spread.lead_max_ms - min(lead_ms, latest_ms))
        self._windows += 1
        if self._move_windows:
            self._move_windows -= 1
            if not self._move_windows:
                self.move_short_ms = 0.0  # the client did not follow: a short take is late audio again
        if self._margin_peaks:
            self._late_window = self._margin_peaks[-1][0]
        while self._margin_peaks and self._margin_peaks[0][0] < self._windows - ADVICE_MEMORY_WINDOWS:
            self._margin_peaks.popleft()
        if lead_ms == float("inf") or from_position is None:
            return None
        period_ms = self.period_ms
        spread_goal_ms = self.spread_goal_ms() if spread is not None else None
        if spread_goal_ms is not None:
            # the earliest-landing piece is the caller's phase; the later ones are the jitter the goal allows for
            goal_ms, calm = spread_goal_ms, True
            wait_ms += spread.lead_max_ms - lead_ms
            lead_ms = spread.lead_max_ms
        else:
            goal_ms = max([margin_ms, *(peak for _, peak in self._margin_peaks)]) + ADVICE_SAFETY_MS
            calm = self._windows - self._late_window >= ADVICE_CALM_WINDOWS
        shift_ms = 0.0
        further_first = spread_goal_ms is not None or self._late_window == self._windows - 1
        if further_first and goal_ms - lead_ms >= ADVICE_MIN_MS:
            # A piece of this window came late (or the spread's percentile grew) and the pieces land inside the goal
            # it raised: further from the tick, by a shorter piece even with nothing standing (the framer pads that
            # one take and does not count it as late audio). Without this move a follower stayed where the late piece
            # had found it.
            shift_ms = round(max(lead_ms - goal_ms, -period_ms / 2), 1)  # at most half a period, as any move
        elif wait_ms - goal_ms >= ADVICE_MIN_MS:
            shift_ms = period_ms / 2 - (period_ms / 2 - (lead_ms - goal_ms)) % period_ms
            if shift_ms < -standing_ms:
                shift_ms += period_ms
            if lead_ms > goal_ms and not calm:
                shift_ms = 0.0  # closer to the tick only where no piece came late for a while
            shift_ms = round(shift_ms, 1) if abs(shift_ms) >= ADVICE_MIN_MS else 0.0
        if shift_ms < 0:
            self.move_short_ms, self._move_windows = -shift_ms + 2.0, 3
        return PhaseAdvice(shift_ms, from_position)
