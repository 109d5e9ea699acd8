"""Tick-aligned framing: a session's input stream cut into engine frames that complete just before their tick.

A fixed frame grid (frame k = samples ``k*N .. (k+1)*N`` of the stream) completes at a phase that has
nothing to do with the engine clock, so each frame waits 0 to one whole tick for the tick that takes
it: with 80 ms frames, 40 ms on average, forever, for every session. Here the worker's tick takes the
``N`` oldest samples of a FIFO instead, and the FIFO is kept just deep enough that the frame it takes
always ends with audio that arrived moments before the tick:

- A new stream starts at the first tick with whatever has arrived (less than a frame is padded in
  front; a burst right behind the start is all kept); the standing-depth trim below brings it in
  phase within a window. After a pause or a prefill
  (``realign``), the first take waits for a whole frame and drops whole frames of what is buffered
  beyond it and the margin: that audio is late. (Whole frames: a client that sends frames gets them
  back intact; the trim below then aligns the phase.)
- A take that finds less than a frame (the newest audio arrived late) is padded in front, not
  delayed by a tick, and the margin grows by the shortfall: jitter is met with a slightly deeper
  FIFO, not with a standing extra frame. A take that finds nothing at all (a client of whole frames whose frame came
  after the tick) grows the margin by how late the frame came, and the take after it trims the backlog the silent
  tick left, as far as a piece end that came the margin (as it was before) ahead of the tick (``_trim_late_backlog``).
  A take short by no more than a move the advice just asked for is the client's move, not late audio.
- Over each window of ticks, the smallest depth left after a take is the part of the FIFO that never
  moves: beyond the margin (plus a little hysteresis) it is pure latency and is dropped; when the
  window had no short take, the margin gives back a quarter of its excess, so it follows the jitter down again
  within seconds.
- That trim lands the frame's end on a piece boundary where it can (``_aligned_drop``): the end of the
  newest piece whose arrival, even at the window's worst, came at least the margin before the tick (a client of
  whole frames can keep no margin: for it, in all takes but one, at least the margin's floor). A
  frame that ends inside a piece holds that piece's first samples back for the rest of it (the client cut
  the piece later), and a frame end inside the newest piece is not safer for it either: if that piece is
  late, the frame is short all the same. Measured on the call page (20 ms pieces), the capture wait of a
  frame's last sample was 10-16 ms in most 60 s echo calls, and 1-2 ms in those whose frames happened to end
  at a piece boundary, which were 20-30 ms faster end to end (bench/notes/latency.md, 96926a3).

A client of whole frames (80 ms, say) fixes by where it cuts them how long their ends wait for the tick, and only
it can move that: each window's ``PhaseAdvice`` says how (``inference.audio.phase_advice``, sent as
``session.metrics``' ``input_shift_ms``).

Trims never cut the caller's words: a standing backlog or a phase alignment is dropped only when the audio it
would drop is quiet (RMS below ``QUIET_RMS``). While the caller speaks, the backlog goes through the gaps inside
their speech: each take may consume up to the trim's remainder beyond its frame and cut that much out of its
quiet ``GAP_BLOCK_MS`` blocks (the silences between words and before stops; ``inference.audio.quiet_gaps``), so the
frame stays whole and its words intact. In the load bench's speech a pause as long as a late 80 ms frame's trim
comes 0.8 s after a random instant at the median and 4.8 s at p99; 75 ms of its 5 ms gaps pass within 0.4 s (1.3 s
p99; bench/speech_gaps.py).
Whatever the engine hears of a call was said; the bound (``max_frames``) is the one place audio is shed while
loud, and that is counted as dropped input. (With the call page's 20 ms pieces an alignment trim was at most 20 ms;
a client that sends 80 ms frames lost one or two whole frames of speech a call to it.)

``push`` runs on the session's event loop and ``take`` on the worker thread, hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from inference.audio.phase_advice import PhaseAdvice, PhaseAdviser
from inference.audio.piece_ends import aligned_end, newest_end_before
from inference.audio.quiet_gaps import GAP_BLOCK_MS, QUIET_RMS, cut_gaps
from inference.audio.take_window import TakeWindow

WINDOW_TICKS = 12  # about 1 s at 80 ms: long enough to see the jitter, short enough to cut a backlog quickly
START_MARGIN_MS = 15.0
MIN_MARGIN_MS = 5.0
MAX_MARGIN_MS = 60.0
# After a window without a short take, the margin gives back a quarter of what it holds above its floor
# (at least DECAY_MS): one late piece early in a call grew it by up to 60 ms, and at 1 ms per window
# that stayed on as latency for the rest of a 60 s echo call (round trip p50 49 ms instead of 15-23).
DECAY_MS = 1.0
DECAY_FRACTION = 0.25
HYSTERESIS_MS = 10.0  # standing depth tolerated above the margin before it is dropped


@dataclass(frozen=True)
class TakenFrame:
    """One frame for the tick and where it ends in the session's input stream.

    Attributes:
        audio: ``frame_samples`` float32 samples (silence-padded in front when short).
        end_position: samples of the stream pushed before this frame's last sample, plus one: the
            stream position the tick heard up to (dropped samples count, so it is the client's).
        short: the frame was padded because the newest audio had not arrived.
        wait_s: how long the frame's newest sample waited in the FIFO.
    """

    audio: np.ndarray
    end_position: int
    short: bool
    wait_s: float


class TickAlignedFramer:
    """A bounded sample FIFO whose frames are cut so they complete just before the tick that takes them.

    Args:
        frame_samples: samples per engine frame (the engine's ``input_chunk_samples``).
        rate: the stream's sample rate (Hz), to turn the margins into samples.
        max_frames: bound of the FIFO in frames; overflow drops the oldest samples.
        clock: monotonic seconds (tests pass their own to place pushes and ticks in time).
        quiet_rms: trims drop only spans whose RMS is below this; None trims whatever stands (the trims'
            timing alone, for tests of it).
    """

    def __init__(
        self,
        frame_samples: int,
        rate: int,
        *,
        max_frames: int = 16,
        clock=time.monotonic,
        quiet_rms: float | None = QUIET_RMS,
    ):
        if frame_samples < 1 or rate < 1 or max_frames < 1:
            raise ValueError("frame_samples, rate and max_frames must be >= 1")
        self.frame_samples = frame_samples
        self._per_ms = rate / 1000.0
        self._buffer = np.zeros(frame_samples * max_frames, dtype=np.float32)
        self._lock = threading.Lock()
        self._clock = clock
        self._quiet_rms = quiet_rms
        self._start = 0  # index of the oldest buffered sample in _buffer
        self._size = 0  # buffered samples
        self._position = 0  # samples ever pushed (the stream position after the newest sample)
        self._pushes: deque[tuple[int, float]] = deque()  # (stream position after a push, monotonic time)
        self._piece_samples = 0  # the newest push's length
        self._mode = "fresh"  # fresh (a new stream) | realign (keep only the newest) | aligned
        self.margin = self._samples(START_MARGIN_MS)
        self._new_window()
        self._adviser = PhaseAdviser(frame_samples / self._per_ms)
        self._empty_take_at: float | None = None  # a take found nothing (an underrun): when, until the next push
        self._late_backlog = False  # a piece came after its tick: the next take trims the backlog it leaves
        self._margin_before_late = self.margin  # what that trim keeps clear of the tick (see _trim_late_backlog)
        self.advice: PhaseAdvice | None = None  # from the latest window with a whole frame (see PhaseAdvice)
        self.dropped = 0  # samples lost: overflow, alignment and standing-depth trims
        self.stale_dropped = 0  # samples from before a realign (a prefill, a pause) that its first take dropped
        self.short_frames = 0
        self._trim_keeps = 0  # the depth the waiting trim leaves

    @property
    def pending(self) -> int:
        """Buffered samples."""
        return self._size

    def push(self, samples: np.ndarray) -> int:
        """Append samples; returns how many old samples the bound pushed out (0 normally)."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        capacity = len(self._buffer)
        with self._lock:
            if len(samples) > capacity:  # only the newest part of one huge push fits
                skipped = len(samples) - capacity
                overflow = self._size + skipped
                self._drop(self._size)
                self.dropped += skipped
                self._position += skipped
                samples = samples[skipped:]
            else:
                overflow = max(0, self._size + len(samples) - capacity)
                self._drop(overflow)
            end = (self._start + self._size) % capacity
            first = min(len(samples), capacity - end)
            self._buffer[end : end + first] = samples[:first]
            self._buffer[: len(samples) - first] = samples[first:]
            self._size += len(samples)
            self._position += len(samples)
            now = self._clock()
            self._pushes.append((self._position, now))
            self._window.piece_pushed(len(samples), self.frame_samples, self._piece_samples)
            self._piece_samples = len(samples)
            if self._empty_take_at is not None:
                # A client of whole frames whose frame came after its tick: the take found nothing, not a short
                # frame, so the margin grows here by how late it came (as by a short take's shortfall). Later than
                # a whole period is a pause, not jitter.
                late_ms = (now - self._empty_take_at) * 1000.0
                if late_ms < self.frame_samples / self._per_ms:
                    if not self._late_backlog:
                        self._margin_before_late = self.margin
                    self.margin = min(self._samples(MAX_MARGIN_MS), self.margin + self._samples(late_ms))
                    self._adviser.margin_grew(self.margin / self._per_ms)
                    self._late_backlog = True
                self._empty_take_at = None
            return overflow

    def take(self) -> TakenFrame | None:
        """The tick's frame, or None when nothing new arrived since the last take (an underrun)."""
        n = self.frame_samples
        with self._lock:
            if self._mode == "fresh":
                if self._size == 0:
                    return None
                self._mode = "aligned"
                frame = self._pop_padded(min(self._size, n))  # what waited for this tick would stay on as latency
                short = False
            elif self._mode == "realign":
                if self._size < n:
                    return None  # a resumed stream begins with a whole frame, as the client sent it
                stale = max(0, self._size - n - self.margin) // n * n  # audio from before the (re)start is late
                self._discard(stale)
                self.stale_dropped += stale
                self._mode = "aligned"
                frame = self._pop_padded(n)
                short = False
            elif self._size == 0:
                self._window.short = True
                if self._empty_take_at is None:  # the first tick the newest piece missed
                    self._empty_take_at = self._clock()
                return None
            else:
                got = min(self._size, n)
                short = got < n
                if short:
                    self.short_frames += 1
                    self._window.short = True
                    # the client's move further from the tick, not late audio: only a piece cut shorter (a trim may
                    # have taken some of it), not a piece of the usual length that came late
                    if self._window.moved and n - got <= self._samples(self._adviser.move_short_ms):
                        self._adviser.move_taken()
                    else:
                        self.margin = min(self._samples(MAX_MARGIN_MS), self.margin + (n - got))
                        self._adviser.margin_grew(self.margin / self._per_ms)
                frame = self._pop_through_gaps() if self._waiting_trim and not short else None
                if frame is None:
                    frame = self._pop_padded(got)
                if self._late_backlog:
                    self._trim_late_backlog(self._clock())
            end_position = self._position - self._size
            now = self._clock()
            wait_s = self._wait_of(end_position, now)
            if self._window.from_position is None:
                self._window.from_position = end_position
            self._end_of_tick(now)
            return TakenFrame(frame, end_position, short, wait_s)

    def realign(self) -> None:
        """The next take starts the stream afresh (after a pause or a prefill): it keeps only the newest audio."""
        with self._lock:
            self._mode = "realign"
            self._new_window()
            self._empty_take_at = None  # the stream restarts: its next piece is not late for a tick
            self._late_backlog = False

    def clear(self) -> None:
        """Forget the buffered audio (a frozen slot resumes from fresh audio); the next take realigns."""
        with self._lock:
            self._drop(self._size)
            self._mode = "realign"

    def reset(self) -> None:
        """A new session on this slot: empty, stream position 0, margin and counters as at the start."""
        with self._lock:
            self._start = self._size = self._position = self._piece_samples = 0
            self._pushes.clear()
            self._mode = "fresh"
            self.margin = self._samples(START_MARGIN_MS)
            self._new_window()
            self.advice, self._empty_take_at, self._late_backlog = None, None, False
            self._margin_before_late = self.margin
            self._adviser.reset()
            self.dropped = self.stale_dropped = self.short_frames = 0

    def keep_newest(self, samples: int) -> int:
        """Drop all but the newest ``samples`` (a slot in prefill takes none); returns how many were dropped.

        Not counted in ``dropped``: the caller counts these itself (the worker's ``dropped_in``, audio spoken
        while the model was not yet listening), and the same samples must not show twice in the metrics.
        """
        with self._lock:
            excess = max(0, self._size - samples)
            self._discard(excess)
            return excess

    def drop_if_stale(self, age_s: float) -> int:
        """Drop everything when the newest audio arrived more than ``age_s`` ago (a prefill's end: a caller
        that held its audio meanwhile left only what it sent before, which would stand as latency); returns
        how many samples were dropped. Uncounted in ``dropped``, as ``keep_newest``."""
        with self._lock:
            if self._size == 0 or not self._pushes or self._clock() - self._pushes[-1][1] <= age_s:
                return 0
            stale = self._size
            self._discard(stale)
            return stale

    # ---- internals (lock held) ----------------------------------------------------------------------

    def _samples(self, ms: float) -> int:
        return int(round(ms * self._per_ms))

    def _drop(self, count: int) -> None:
        if count > 0:
            self._discard(count)
            self.dropped += count

    def _discard(self, count: int) -> None:
        if count > 0:
            self._start = (self._start + count) % len(self._buffer)
            self._size -= count

    def _quiet(self, count: int) -> bool:
        """Whether the oldest ``count`` buffered samples are quiet enough to trim (always, without a threshold)."""
        if self._quiet_rms is None:
            return True
        span = self._peek(count)
        return float(np.dot(span, span)) < self._quiet_rms**2 * count

    def _pop_padded(self, count: int) -> np.ndarray:
        """The oldest ``count`` samples, preceded by silence up to a whole frame."""
        frame = np.zeros(self.frame_samples, dtype=np.float32)
        capacity = len(self._buffer)
        first = min(count, capacity - self._start)
        pad = self.frame_samples - count
        frame[pad : pad + first] = self._buffer[self._start : self._start + first]
        frame[pad + first :] = self._buffer[: count - first]
        self._start = (self._start + count) % capacity
        self._size -= count
        return frame

    def _pop_through_gaps(self) -> np.ndarray | None:
        """A whole frame with up to the waiting trim's remainder cut out of its quiet blocks (``cut_gaps``), or None
        when the span it would consume holds no quiet block."""
        n = self.frame_samples
        excess = min(self._waiting_trim, self._size - self._trim_keeps, self._size - n)
        if excess <= 0:
            return None
        quiet_rms = self._quiet_rms if self._quiet_rms is not None else float("inf")
        cut = cut_gaps(self._peek(n + excess), n, max(1, self._samples(GAP_BLOCK_MS)), quiet_rms)
        if cut is None:
            return None
        frame, d = cut
        self._discard(n + d)
        self.dropped += d
        self._waiting_trim -= d
        return frame

    def _peek(self, count: int) -> np.ndarray:
        """A copy of the oldest ``count`` buffered samples."""
        capacity = len(self._buffer)
        first = min(count, capacity - self._start)
        return np.concatenate((self._buffer[self._start : self._start + first], self._buffer[: count - first]))

    def _wait_of(self, position: int, now: float) -> float:
        """How long ago the push that delivered the sample just before stream position ``position`` happened."""
        while self._pushes and self._pushes[0][0] < position:
            self._pushes.popleft()  # pushes taken entirely by earlier frames
        return now - self._pushes[0][1] if self._pushes else 0.0

    def _new_window(self) -> None:
        self._window = TakeWindow()
        self._waiting_trim = 0  # samples the last window found standing, dropped when they are quiet
        self._late_trim = False  # that trim is a late backlog's (``_trim_late_backlog``)

    def _trim_when_quiet(self) -> None:
        """Drop the trim the last window found as soon as the oldest audio it covers is quiet.

        Tried at the window's end only, a trim of loud audio waited a whole window for the next try, and a
        caller's pauses fall between the tries as often as not: a 200 ms pause every second, against a window
        of 960 ms, came under a window's end in 3 of 25 windows, and in the impairment bench an input backlog
        of 80-180 ms from one stall stayed for the rest of a call. Each tick of the next window tries again,
        never leaving less than the trim would have left at the window's end."""
        trim = min(self._waiting_trim, self._size - self._trim_keeps)
        if trim <= 0:
            self._waiting_trim = 0
        elif self._quiet(trim):
            self._drop(trim)
            self._waiting_trim = 0

    def _trim_late_backlog(self, now: float) -> None:
        """After the take that follows a late piece: the backlog it left is trimmed from now on, up to a piece end.

        The tick the piece missed played silence in its place, so from here on the piece and whatever follows it
        stand a whole frame behind the tick; the window's own trim would see that only at the end of the next window
        (about 25 ticks per late piece at 74c2724). The trim ends where a piece ends that came at least the margin
        from *before* the late piece grew it ahead of this tick: judged by the grown one, a follower of the advice
        kept its frame back for seconds after any piece more than 10 ms late, and one late piece costs its own frame
        while a frame kept back costs every frame meanwhile (bench/notes/serving-e2e.md). A client whose pieces come
        closer to the tick than that keeps its frame back, the safe place for it."""
        self._late_backlog = False
        margin_s = self._margin_before_late / self._per_ms / 1000.0
        best = newest_end_before(self._pushes, self._position - self._size, now, margin_s)
        if best > self._samples(HYSTERESIS_MS) and best > self._waiting_trim:
            self._waiting_trim, self._trim_keeps, self._late_trim = best, self._size - best, True

    def _end_of_tick(self, now: float) -> None:
        if self._waiting_trim:
            self._trim_when_quiet()
        window = self._window
        window.take_ended(self._size, now - self._pushes[-1][1] if self._pushes else None, self._per_ms)
        if window.ticks < WINDOW_TICKS:
            return
        aligned = self._aligned_drop()
        standing = window.min_depth - self.margin
        trim = aligned if aligned is not None else standing if standing > self._samples(HYSTERESIS_MS) else 0
        if not window.short:
            floor = self._samples(MIN_MARGIN_MS)
            give_back = max(self._samples(DECAY_MS), int((self.margin - floor) * DECAY_FRACTION))
            self.margin = max(floor, self.margin - give_back)
        advice = self._adviser.window_ended(  # against the margin the next takes keep
            lead_ms=window.lead * 1000.0,
            wait_ms=window.wait * 1000.0 - max(0, trim) / self._per_ms,
            standing_ms=(window.min_depth - max(0, trim)) / self._per_ms,
            margin_ms=self.margin / self._per_ms,
            from_position=window.from_position,
        )
        self.advice = advice or self.advice
        # A trim still being cut goes on: a window that held a late piece's empty take finds no standing depth of its
        # own to trim, yet its backlog stands (``_trim_late_backlog``). It goes as far as it stays beyond the margin,
        # but a late backlog's trim was judged against the margin before the late piece grew it, and stopped at the
        # grown one it would leave part of a whole frame standing, every frame then ending inside a piece.
        floor = self._trim_keeps if self._late_trim else max(self._trim_keeps, self.margin)
        carried = min(self._waiting_trim, self._size - floor)
        late_trim = self._late_trim and carried > 0 and carried >= trim
        trim = max(trim, carried)
        self._new_window()
        self._waiting_trim, self._trim_keeps = max(0, trim), self._size - max(0, trim)
        self._late_trim = late_trim
        self._trim_when_quiet()

    def _aligned_drop(self) -> int | None:
        """Samples to drop so that frames end where a piece ends, or None when no piece end will do.

        Of the piece ends that every take of the window left buffered and that arrive at least the margin before
        the tick at the window's worst (``piece_ends.aligned_end``), the newest: 0 when the frame already ends there.

        A client of whole frames (every piece of the window a frame or more) can keep no partial depth: its frames
        end at the newest piece or a whole piece back, which costs every frame a period while a late piece costs its
        own frame (the take after it trims the backlog). Its newest piece end is kept unless it came within the
        margin's floor of the tick in more than one take of the window; judged by the window's worst take against
        the grown margin, such a caller under a loaded host's jitter stayed a piece back for good once a late piece
        had put it there (``bench/framing_jitter.py``).
        """
        window = self._window
        if not self._pushes or window.lead == float("inf") or window.short:
            return None
        if window.whole_pieces and window.lead2 != float("inf"):
            lead, margin_s = window.lead2, MIN_MARGIN_MS / 1000.0
        else:
            lead, margin_s = window.lead, self.margin / self._per_ms / 1000.0
        end, newest_at = self._position - self._size, self._pushes[-1][1]
        return aligned_end(self._pushes, end, window.min_depth, newest_at, lead, margin_s)
