"""The phase advice: where a client of whole pieces should cut them so each lands just before its tick.

A client that sends whole pieces (80 ms frames, say) decides by where it cuts them how long the frame's end waits for
its tick: 0 to a whole period, fixed for the call by its phase against the tick; and once a piece that lands just
before its tick comes after it, the frames after it stand a whole period more. The framer
(``inference.audio.framing``) can cut frames only at piece ends (a frame ending inside a piece holds that piece's
start back), so only the client can move that phase. Once a window of takes, the framer hands this module what it
saw and passes the advice on (``session.metrics``' ``input_shift_ms``, docs/protocol.md).
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class PhaseAdvice:
    """How the client should move where it cuts its audio pieces, measured over one window of takes.

    Cutting the next piece ``shift_ms`` longer (shorter when negative) lands the pieces after it just the margin
    (plus ``ADVICE_SAFETY_MS``) before their tick; the framer then trims the standing audio that frees, as it trims
    any, when it is quiet. No sample is captured later for it: only the piece boundaries move.

    Attributes:
        shift_ms: the move, in [-period/2, period/2] the nearer way round, up to a period when a shorter piece
            would leave a tick without a whole frame (but just after a late piece shorter all the same: the framer
            pads that tick once); 0 when the pieces already land within ``ADVICE_MIN_MS`` of the goal or closer to
            the tick, or when the move would land them closer within ``ADVICE_CALM_WINDOWS`` of a late piece.
        from_position: the stream position of the window's first frame end: advice measured on audio the client
            sent before its latest move is stale, and a client skips it.
    """

    shift_ms: float
    from_position: int


class PhaseAdviser:
    """One stream's advice, window by window, and the memory of its late pieces that keeps the advice safe.

    Args:
        period_ms: the engine frame's length: moves are taken modulo it.
    """

    def __init__(self, period_ms: float):
        self.period_ms = period_ms
        self.reset()

    def reset(self) -> None:
        """A new stream: no window seen, no late piece remembered."""
        self._windows = 0  # windows ended
        self._margin_peaks: deque[tuple[int, float]] = deque()  # (window, margin ms) just after each growth
        self._late_window = -ADVICE_CALM_WINDOWS  # the window of the latest growth for late audio
        # A shorter piece asked for leaves one take short by the move (the client's, not late audio) if the client
        # follows within a few windows: how far (ms, with 2 ms of slack), and for how many more window ends
        self.move_short_ms, self._move_windows = 0.0, 0

    def move_taken(self) -> None:
        """The framer met the short take a shorter piece asked for: the move is done."""
        self.move_short_ms = 0.0

    def margin_grew(self, margin_ms: float) -> None:
        """The framer's margin grew to ``margin_ms`` for late audio (a short take, or a whole piece after its tick)."""
        self._margin_peaks.append((self._windows, margin_ms))

    def window_ended(
        self, *, lead_ms: float, wait_ms: float, standing_ms: float, margin_ms: float, from_position: int | None
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
        asked for until ``ADVICE_CALM_WINDOWS`` have passed without a late piece. A wait already within
        ``ADVICE_MIN_MS`` of the goal, or under it, asks for no move (a lead inside the margin with no late piece
        yet), except in a window where a piece came late: then the move further is asked for even with nothing
        standing (the framer trims a late piece's backlog at once).
        """
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
        goal_ms = max([margin_ms, *(peak for _, peak in self._margin_peaks)]) + ADVICE_SAFETY_MS
        shift_ms = 0.0
        if self._late_window == self._windows - 1 and goal_ms - lead_ms >= ADVICE_MIN_MS:
            # A piece of this window came late and the pieces land inside the goal it raised: further from the tick,
            # by a shorter piece even with nothing standing (the framer pads that one take and does not count it as
            # late audio). Without this move a follower stayed where the late piece had found it.
            shift_ms = round(max(lead_ms - goal_ms, -period_ms / 2), 1)  # at most half a period, as any move
        elif wait_ms - goal_ms >= ADVICE_MIN_MS:
            shift_ms = period_ms / 2 - (period_ms / 2 - (lead_ms - goal_ms)) % period_ms
            if shift_ms < -standing_ms:
                shift_ms += period_ms
            if lead_ms > goal_ms and self._windows - self._late_window < ADVICE_CALM_WINDOWS:
                shift_ms = 0.0  # closer to the tick only where no piece came late for a while
            shift_ms = round(shift_ms, 1) if abs(shift_ms) >= ADVICE_MIN_MS else 0.0
        if shift_ms < 0:
            self.move_short_ms, self._move_windows = -shift_ms + 2.0, 3
        return PhaseAdvice(shift_ms, from_position)
