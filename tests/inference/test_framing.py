"""Tick-aligned framing: frames end with the newest audio at their tick, the stream stays whole."""

from __future__ import annotations

import numpy as np
import pytest

from inference.audio.framing import MIN_MARGIN_MS, START_MARGIN_MS, WINDOW_TICKS, TickAlignedFramer
from inference.audio.phase_advice import ADVICE_CALM_WINDOWS, ADVICE_MIN_MS, ADVICE_SAFETY_MS, PhaseAdviser

RATE = 24_000
N = 1920  # 80 ms
PIECE = 240  # 10 ms, what the call page sends
MARGIN = int(START_MARGIN_MS * RATE / 1000)


def ramp(start: int, count: int) -> np.ndarray:
    """Samples whose values are their stream positions (scaled), so frames can be checked exactly. Scaled far
    below QUIET_RMS (float32 still holds every position exactly), so the trims may drop them: these tests are
    about when and where the framer trims; the loud-audio tests below are about what it never trims."""
    return (np.arange(start, start + count) / 1e8).astype(np.float32)


def positions(frame: np.ndarray) -> np.ndarray:
    return np.rint(frame.astype(np.float64) * 1e8).astype(int)


def test_a_new_stream_starts_at_the_first_tick_padded_in_front():
    framer = TickAlignedFramer(N, RATE)
    framer.push(ramp(0, 1000))
    taken = framer.take()
    assert np.all(taken.audio[: N - 1000] == 0)
    np.testing.assert_array_equal(positions(taken.audio[N - 1000 :]), np.arange(0, 1000))
    assert taken.end_position == 1000 and framer.pending == 0


def test_a_new_stream_keeps_a_burst_at_its_start():
    framer = TickAlignedFramer(N, RATE)
    assert framer.take() is None  # nothing yet: an underrun, the worker feeds silence
    framer.push(ramp(0, 3 * N + 100))
    heard = [positions(framer.take().audio) for _ in range(3)]
    np.testing.assert_array_equal(np.concatenate(heard), np.arange(0, 3 * N))
    assert framer.dropped == 0


def test_after_realign_the_first_take_drops_the_older_backlog_in_whole_frames():
    framer = TickAlignedFramer(N, RATE)
    framer.realign()  # a prefill ended
    framer.push(ramp(0, 3 * N))  # three frames buffered meanwhile: latency, not audio
    taken = framer.take()
    assert taken is not None and not taken.short
    assert taken.end_position == 2 * N  # one whole frame dropped: the rest fits a frame and the margin
    np.testing.assert_array_equal(positions(taken.audio), np.arange(N, 2 * N))
    assert framer.pending == N
    assert (framer.stale_dropped, framer.dropped) == (N, 0)  # from before the restart: not a trim of live audio
    pushed = 3 * N
    for _ in range(WINDOW_TICKS):  # steady input: within a window the standing part beyond the margin goes
        framer.push(ramp(pushed, N))
        pushed += N
        taken = framer.take()
    assert pushed - taken.end_position <= MARGIN


def test_a_restarted_stream_waits_for_a_whole_frame():
    framer = TickAlignedFramer(N, RATE)
    framer.realign()
    assert framer.take() is None
    framer.push(ramp(0, 1000))
    assert framer.take() is None  # an underrun (silence), not a padded scrap of audio
    framer.push(ramp(1000, N - 1000))
    taken = framer.take()
    np.testing.assert_array_equal(positions(taken.audio), np.arange(0, N))  # the client's frame, intact


def test_steady_pieces_give_contiguous_frames_that_end_at_the_newest_audio():
    framer = TickAlignedFramer(N, RATE)
    pushed, heard = 0, []
    for _ in range(100):
        for _piece in range(N // PIECE):  # eight 10 ms pieces between two ticks
            framer.push(ramp(pushed, PIECE))
            pushed += PIECE
        taken = framer.take()
        assert taken is not None and not taken.short
        heard.append(positions(taken.audio))
        # the frame ends at most the margin (plus a piece of phase) behind what has arrived
        assert pushed - taken.end_position <= MARGIN + PIECE
    stream = np.concatenate(heard[1:])
    np.testing.assert_array_equal(stream, np.arange(stream[0], stream[0] + len(stream)))  # nothing lost or repeated
    assert framer.short_frames == 0


class PieceCaller:
    """A caller sending 10 ms ramp pieces: ``tick(pieces)`` pushes that many, then takes the tick's frame."""

    def __init__(self) -> None:
        self.framer = TickAlignedFramer(N, RATE)
        self.pushed = 0

    def tick(self, pieces: int):
        for _ in range(pieces):
            self.framer.push(ramp(self.pushed, PIECE))
            self.pushed += PIECE
        return self.framer.take()


def test_late_audio_pads_one_frame_grows_the_margin_and_adds_no_standing_frame():
    caller = PieceCaller()
    framer, tick = caller.framer, caller.tick

    for _ in range(10):
        tick(8)
    margin_before = framer.margin
    late = tick(5)  # three pieces (30 ms) arrive after this tick
    assert late is not None and late.short
    assert np.count_nonzero(late.audio[: 3 * PIECE - MARGIN]) == 0
    assert framer.margin > margin_before
    following = tick(11)  # ... and arrive with the next one
    assert following is not None and not following.short
    # within a window the extra depth is dropped again: the frame ends near the newest audio
    for _ in range(2 * WINDOW_TICKS):
        taken = tick(8)
    assert caller.pushed - taken.end_position <= framer.margin + PIECE
    assert framer.short_frames == 1


def test_the_margin_a_late_piece_added_is_given_back_within_seconds_of_calm():
    caller = PieceCaller()
    framer, tick = caller.framer, caller.tick

    tick(8)
    assert tick(2).short  # 60 ms late: the margin grows by the shortfall (to its 60 ms cap here)
    grown = framer.margin
    assert grown >= MARGIN + 4 * PIECE
    tick(14)
    for _ in range(10 * WINDOW_TICKS):  # 10 s of steady pieces
        tick(8)
    assert framer.short_frames == 1
    assert framer.margin <= int(MIN_MARGIN_MS * RATE / 1000) + 2 * PIECE  # back near its floor, not grown - 10 ms


def test_a_standing_backlog_is_trimmed_within_a_window():
    framer = TickAlignedFramer(N, RATE)
    pushed = 0
    for _ in range(5):
        framer.push(ramp(pushed, N))
        pushed += N
        framer.take()
    framer.push(ramp(pushed, 2 * N))  # a burst: two extra frames that will never drain by themselves
    pushed += 2 * N
    for _ in range(2 * WINDOW_TICKS):  # the window that saw the burst whole ends within two
        framer.push(ramp(pushed, N))
        pushed += N
        taken = framer.take()
    assert pushed - taken.end_position <= framer.margin + N // 8 + 1


def test_a_prefills_end_drops_what_a_holding_caller_sent_before_it_and_keeps_a_fresh_frame():
    now = [0.0]
    framer = TickAlignedFramer(N, RATE, clock=lambda: now[0])
    framer.push(ramp(0, N))  # the first frame opens the slot; the caller then holds its audio until the prefill ends
    now[0] = 1.0
    assert framer.drop_if_stale(0.08) == N and framer.pending == 0 and framer.dropped == 0
    framer.push(ramp(N, N))  # a caller that never held: its newest frame is fresh and stays
    now[0] = 1.05
    assert framer.drop_if_stale(0.08) == 0 and framer.pending == N


def test_realign_and_clear_start_the_stream_afresh():
    framer = TickAlignedFramer(N, RATE)
    framer.push(ramp(0, 4 * N))
    framer.take()
    framer.clear()
    assert framer.pending == 0
    assert framer.take() is None
    framer.push(ramp(4 * N, N))
    cleared = framer.dropped
    assert framer.keep_newest(N // 2) == N // 2
    assert framer.dropped == cleared  # the worker counts a prefill's discards (dropped_in); twice would double them
    assert framer.take() is None
    framer.push(ramp(5 * N, N))
    taken = framer.take()
    assert taken is not None and taken.end_position == 5 * N + N // 2  # nothing to drop: under a frame beyond


def test_the_bound_drops_the_oldest_audio():
    framer = TickAlignedFramer(N, RATE, max_frames=2)
    assert framer.push(ramp(0, N)) == 0
    assert framer.push(ramp(N, 2 * N)) == N
    assert framer.pending == 2 * N
    assert framer.push(ramp(3 * N, 5 * N)) == 5 * N  # all that was buffered, and the older 3 N of the push
    assert framer.pending == 2 * N
    framer.take()
    assert framer.take().end_position == 8 * N - framer.pending


def test_reset_starts_a_new_stream_at_position_zero():
    framer = TickAlignedFramer(N, RATE)
    framer.push(ramp(0, 3 * N))
    framer.take()
    framer.reset()
    assert (framer.pending, framer.dropped, framer.short_frames) == (0, 0, 0)
    framer.push(ramp(0, N + MARGIN))
    assert framer.take().end_position == N


class TimedCaller:
    """A caller on a clock: 20 ms pieces (what the call page sends), the newest before each 80 ms tick arriving
    ``lead_s`` before it, and pieces listed in ``late`` arriving that much later. The framer sees when pieces
    and ticks happen, not just their order."""

    PIECE = 480

    def __init__(self, lead_s: float, late: dict[int, float]) -> None:
        self.now = 0.0
        self.framer = TickAlignedFramer(N, RATE, clock=lambda: self.now)
        self.lead_s = lead_s
        self.late = late
        self.pushed = 0
        self.piece = 0
        self.ticks = 0

    def tick(self):
        self.ticks += 1
        tick_at = 0.080 * self.ticks
        while (arrival := 0.020 * (self.piece + 1) - self.lead_s + self.late.get(self.piece, 0.0)) <= tick_at:
            self.now = arrival
            self.framer.push(ramp(self.pushed, self.PIECE))
            self.pushed += self.PIECE
            self.piece += 1
        self.now = tick_at
        return self.framer.take()

    def run(self, ticks: int) -> list[int]:
        """Take ``ticks`` frames; returns each one's residual: samples that had arrived beyond its end."""
        residuals = []
        for _ in range(ticks):
            taken = self.tick()
            residuals.append(self.pushed - taken.end_position)
        return residuals


def test_after_a_late_piece_frames_come_to_end_where_the_newest_piece_ends():
    # the newest piece of tick 6 30 ms late: a short take pads the stream, the piece then stands in the FIFO and is trimmed
    caller = TimedCaller(lead_s=0.012, late={23: 0.030})
    piece = TimedCaller.PIECE
    residuals = caller.run(20 * WINDOW_TICKS)  # 20 s
    assert caller.framer.short_frames == 1
    # the padded piece keeps frames one piece back while the grown margin says so; the trim then never leaves
    # a frame ending inside a piece (a margin's worth short of its end, as it used to): once the margin has
    # decayed below the newest piece's 12 ms lead, every frame ends exactly with the newest piece
    assert residuals[-3 * WINDOW_TICKS :] == [0] * (3 * WINDOW_TICKS)
    assert caller.framer.margin < int(0.012 * RATE)
    assert caller.framer.dropped < 3 * piece  # the late piece's padding taken back, and no more


def test_a_newest_piece_inside_the_margin_leaves_frames_ending_at_the_piece_before():
    caller = TimedCaller(lead_s=0.002, late={23: 0.030})  # the newest piece lands 2 ms before every tick
    piece = TimedCaller.PIECE
    residuals = caller.run(20 * WINDOW_TICKS)
    # 2 ms is inside even the margin's 5 ms floor: frames end one whole piece back, never inside one
    assert residuals[-3 * WINDOW_TICKS :] == [piece] * (3 * WINDOW_TICKS)
    assert caller.framer.short_frames == 1


def tone(count: int, level: float = 0.3) -> np.ndarray:
    """Speech-level audio (a 200 Hz tone at ``level`` peak): never quiet enough to trim."""
    return (level * np.sin(2 * np.pi * 200 * np.arange(count) / RATE)).astype(np.float32)


def test_a_loud_backlog_stays_until_the_caller_pauses_then_goes():
    framer = TickAlignedFramer(N, RATE)
    for _ in range(5):
        framer.push(tone(N))
        framer.take()
    framer.push(tone(2 * N))  # a burst of speech: two frames beyond the tick's needs
    for _ in range(3 * WINDOW_TICKS):
        framer.push(tone(N))
        framer.take()
    assert framer.dropped == 0 and framer.pending >= 2 * N  # three windows of speech: nothing cut
    for _ in range(2 * WINDOW_TICKS):  # the caller pauses: the backlog is silence now, and goes
        framer.push(np.zeros(N, dtype=np.float32))
        framer.take()
    assert framer.pending <= framer.margin + N // 8 + 1
    assert framer.dropped >= 2 * N - framer.margin - N // 8 - 1


def eighty_ms_caller(framer: TickAlignedFramer, clock: list[float], audio, ticks: int) -> tuple[int, int]:
    """A client sending whole 80 ms frames, each arriving 30 ms before its tick and frame 7 50 ms late (it comes
    just before frame 8, as after a stall); returns (samples pushed, samples the ticks took that were not padding)."""
    arrivals = [(0.080 * k - 0.030 + (0.050 if k == 7 else 0.0), k) for k in range(1, ticks + 1)]
    arrivals.sort()
    pushed = taken = 0
    for tick in range(1, ticks + 1):
        while arrivals and arrivals[0][0] <= 0.080 * tick:
            clock[0] = arrivals.pop(0)[0]
            framer.push(audio(N))
            pushed += N
        clock[0] = 0.080 * tick
        before = framer.pending
        if framer.take() is not None:
            taken += before - framer.pending
    return pushed, taken


def test_a_client_of_whole_80_ms_frames_loses_no_speech_to_the_alignment():
    # The same clocked caller with trims that ignore loudness: the late frame's phase is realigned by dropping
    # part of a frame, which used to cost callers sending 80 ms frames one or two frames of speech a call.
    clock = [0.0]
    careless = TickAlignedFramer(N, RATE, clock=lambda: clock[0], quiet_rms=None)
    eighty_ms_caller(careless, clock, tone, 10 * WINDOW_TICKS)
    assert careless.dropped > 0
    clock = [0.0]
    framer = TickAlignedFramer(N, RATE, clock=lambda: clock[0])
    pushed, taken = eighty_ms_caller(framer, clock, tone, 10 * WINDOW_TICKS)
    assert framer.dropped == 0 and taken + framer.pending == pushed


def test_a_loud_backlog_goes_in_a_pause_that_falls_between_two_window_ends():
    framer = TickAlignedFramer(N, RATE)
    takes = 0
    for _ in range(5):
        framer.push(tone(N))
        framer.take()
        takes += 1
    framer.push(tone(2 * N))  # a burst of speech: two frames beyond the tick's needs
    while takes < 2 * WINDOW_TICKS:  # a whole window sees the backlog standing; its end finds it loud
        framer.push(tone(N))
        framer.take()
        takes += 1
    assert framer.dropped == 0 and framer.pending >= 2 * N
    for audio in [np.zeros(N, dtype=np.float32)] * 3 + [tone(N)] * (WINDOW_TICKS - 4):  # a 240 ms pause, then speech
        framer.push(audio)
        framer.take()
    # the next window's end is still a tick away (and would find speech at the head): the pause took the backlog
    assert framer.pending <= framer.margin + N // 8 + 1
    assert framer.dropped >= 2 * N - framer.margin - N // 8 - 1


def syllables(start: int, count: int) -> np.ndarray:
    """Speech without a pause: 60 ms syllables of a loud tone, each followed by a 15 ms gap of silence (stream
    positions ``start .. start + count``), so no span the size of a frame is ever quiet."""
    at = np.arange(start, start + count)
    loud = at % 1800 < 1440
    return np.where(loud, 0.3 * np.sin(2 * np.pi * 200 * at / RATE), 0.0).astype(np.float32)


def test_a_backlog_in_unbroken_speech_goes_through_the_gaps_between_syllables_and_keeps_every_syllable():
    framer = TickAlignedFramer(N, RATE)
    pushed = heard = 0.0
    position = 0

    def push(count: int) -> None:
        nonlocal pushed, position
        audio = syllables(position, count)
        framer.push(audio)
        pushed += float(np.dot(audio, audio))
        position += count

    def take() -> None:
        nonlocal heard
        frame = framer.take().audio
        assert len(frame) == N
        heard += float(np.dot(frame, frame))

    for _ in range(5):
        push(N)
        take()
    push(2 * N)  # a late frame arrived with the next: two frames beyond the tick's needs, in speech
    for _ in range(3 * WINDOW_TICKS):  # about three seconds of speech with no pause longer than 15 ms
        push(N)
        take()
    assert framer.pending <= framer.margin + N // 8 + 1  # the backlog went, without a pause
    assert framer.dropped >= 2 * N - framer.margin - N // 8 - 1
    standing = syllables(position - framer.pending, framer.pending)
    assert heard + float(np.dot(standing, standing)) >= pushed * (1 - 1e-4)  # and every syllable was heard


def test_a_backlog_in_speech_without_gaps_stays_until_the_pause():
    # the same burst in a tone without gaps: nothing is quiet, so nothing goes (the test above's control)
    framer = TickAlignedFramer(N, RATE)
    for _ in range(5):
        framer.push(tone(N))
        framer.take()
    framer.push(tone(2 * N))
    for _ in range(3 * WINDOW_TICKS):
        framer.push(tone(N))
        assert len(framer.take().audio) == N
    assert framer.dropped == 0 and framer.pending >= 2 * N


class AdvisedCaller:
    """A caller of whole 80 ms pieces on a clock, each arriving as its last sample is captured (sample ``i`` at
    ``i / RATE``; pieces listed in ``late`` that much later), with ticks ``lead_s`` after every nominal piece end;
    ``follow``: it cuts its next piece longer or shorter by the framer's advice, skipping advice measured on audio
    from before its latest move."""

    def __init__(self, lead_s: float, *, follow: bool, late: dict[int, float] | None = None, audio=None) -> None:
        self.now = 0.0
        self.framer = TickAlignedFramer(N, RATE, clock=lambda: self.now)
        self.lead_s, self.follow, self.late = lead_s, follow, late or {}
        self.audio = audio or (lambda _start, count: np.zeros(count, np.float32))  # quiet: what a move frees goes
        self.pieces = 0
        self.boundary = 0  # the end of the newest piece pushed
        self.next_boundary = N
        self.moved_at = 0  # the end of the piece the latest move changed
        self.moves: list[float] = []
        self.move_ticks: list[int] = []
        self.margins_ms: list[float] = []  # the framer's margin after each take

    def run(self, ticks: int) -> list[float]:
        """Each tick's wait for its frame's end: tick time less when that sample was captured (ms)."""
        waits = []
        for j in range(1, ticks + 1):
            tick_at = 0.080 * j + self.lead_s
            while (arrival := self.next_boundary / RATE + self.late.get(self.pieces, 0.0)) <= tick_at:
                self.now = arrival
                self.framer.push(self.audio(self.boundary, self.next_boundary - self.boundary))
                self.boundary, self.next_boundary = self.next_boundary, self.next_boundary + N
                self.pieces += 1
            self.now = tick_at
            taken = self.framer.take()
            waits.append((tick_at - taken.end_position / RATE) * 1000.0 if taken else float("nan"))
            self.margins_ms.append(self.framer.margin * 1000 / RATE)
            advice = self.framer.advice
            if self.follow and advice and advice.shift_ms and advice.from_position >= self.moved_at:
                self.next_boundary += round(advice.shift_ms * RATE / 1000)
                self.moved_at = self.next_boundary
                self.moves.append(advice.shift_ms)
                self.move_ticks.append(j)
        return waits


GOAL_MS = MIN_MARGIN_MS + ADVICE_SAFETY_MS  # the frame end's wait a follower settles at, once the margin is down


def test_a_caller_following_the_phase_advice_lands_its_pieces_just_the_margin_before_the_tick():
    settled = 3 * WINDOW_TICKS
    # leads across the period; and 2 ms with one piece 5 ms late: it misses its tick, and from then on every
    # frame ends a whole piece back (the lead is inside the margin), 82 ms, for the rest of the call
    for lead_s, late, alone_ms in ((0.030, {}, 30.0), (0.041, {}, 41.0), (0.070, {}, 70.0), (0.002, {50: 0.005}, 82.0)):
        alone = AdvisedCaller(lead_s, follow=False, late=late)
        np.testing.assert_allclose(alone.run(25 * WINDOW_TICKS)[-settled:], alone_ms, atol=0.05)
        caller = AdvisedCaller(lead_s, follow=True, late=late)
        waits = caller.run(75 * WINDOW_TICKS)  # past the calm the late piece asks for before a move closer
        assert caller.framer.margin * 1000 / RATE == MIN_MARGIN_MS  # back at its floor: no piece of its own late
        assert all(GOAL_MS - 0.05 <= w < GOAL_MS + ADVICE_MIN_MS for w in waits[-settled:]), (lead_s, caller.moves)
        assert all(-40 <= m <= 80 for m in caller.moves) and len(caller.moves) <= 4
        # the late piece's tick found nothing (silence), no take was padded, and the stream stays whole: every
        # sample heard, trimmed as quiet standing audio, or still buffered
        assert np.isnan(waits).sum() == len(late) and caller.framer.short_frames == 0
        heard = (len(waits) - len(late)) * N
        assert heard + caller.framer.dropped + caller.framer.pending == caller.boundary


def test_a_late_whole_piece_leaves_no_frame_standing_once_its_backlog_can_go():
    # 30 ms before the tick, piece 50 comes 40 ms late: its tick finds nothing, and the take after it leaves the next
    # piece standing a whole frame behind the tick. Quiet, that backlog goes at once; in speech, through the gaps
    # between syllables within a few ticks (it used to stand 20 ticks, to the end of the next window); in a tone
    # without gaps it stays, as any loud backlog.
    for audio, back_within in ((None, 1), (syllables, 5), (lambda _start, count: tone(count), None)):
        caller = AdvisedCaller(0.030, follow=False, late={50: 0.040}, audio=audio)
        waits = caller.run(6 * WINDOW_TICKS)
        assert np.isnan(waits[50]) and abs(waits[51] - 110.0) < 0.05
        if back_within is None:
            np.testing.assert_allclose(waits[51:], 110.0, atol=0.05)
            assert caller.framer.dropped == 0
        else:
            np.testing.assert_allclose(waits[51 + back_within :], 30.0, atol=0.05)
            assert caller.framer.dropped == N  # the piece the silent tick stood for, no more
        heard = (len(waits) - 1) * N
        assert heard + caller.framer.dropped + caller.framer.pending == caller.boundary


def test_a_caller_whose_pieces_land_under_the_goal_is_asked_for_no_move():
    caller = AdvisedCaller(0.002, follow=True)  # 2 ms before every tick, and never late
    waits = caller.run(10 * WINDOW_TICKS)
    assert caller.moves == [] and caller.framer.advice.shift_ms == 0.0
    np.testing.assert_allclose(waits, 2.0, atol=0.05)


def test_a_loud_caller_following_the_advice_loses_no_speech_to_it():
    caller = AdvisedCaller(0.041, follow=True, audio=lambda _start, count: tone(count))
    caller.run(10 * WINDOW_TICKS)
    assert caller.moves and caller.framer.dropped == 0  # it moved; the audio that freed stands until a pause


def test_after_a_late_piece_no_move_lands_the_pieces_closer_to_the_tick_for_a_while():
    # 30 ms before the tick, then piece 50 comes 40 ms late: its tick finds nothing and the margin grows by how
    # late it came; the move that keeps the pieces clear of that margin comes at once, the one back closer to the
    # tick only once ADVICE_CALM_WINDOWS have passed without another late piece
    caller = AdvisedCaller(0.030, follow=True, late={50: 0.040})
    waits = caller.run(75 * WINDOW_TICKS)
    late_tick = 51
    after = [(j, m) for j, m in zip(caller.move_ticks, caller.moves, strict=True) if j > late_tick]
    assert after[0][1] < 0 and after[0][0] <= late_tick + 2 * WINDOW_TICKS  # further from the tick, at once
    # with nothing standing (the late piece's backlog went at the next take) the shorter piece leaves one take
    # short, and that is the client's move, not late audio: the margin does not grow for it
    assert caller.framer.short_frames == 1 and max(caller.margins_ms[late_tick:]) == caller.margins_ms[late_tick]
    closer = [j for j, m in after if m > 0]
    assert closer and min(closer) >= late_tick + (ADVICE_CALM_WINDOWS - 1) * WINDOW_TICKS
    assert GOAL_MS - 0.05 <= waits[-1] < GOAL_MS + ADVICE_MIN_MS


def test_a_piece_late_past_a_followers_lead_leaves_no_frame_kept_back():
    # Where a follower of the advice settles: 15 ms before the tick (the margin's 5 ms floor plus 10). Piece 200 comes
    # 40 ms late, 25 ms after its tick, so the margin grows past the caller's lead; the trim of the backlog it leaves
    # is judged against the margin from before, and the frames come back to the newest piece at once (quiet) or
    # through the gaps (speech). Judged against the grown margin, they stood a whole frame back for 64 ticks (quiet)
    # and 67 (speech), until the margin had decayed below the lead.
    late = 200
    for audio, back_within in ((None, 1), (syllables, 5)):
        caller = AdvisedCaller(0.015, follow=False, late={late: 0.040}, audio=audio)
        waits = caller.run(late + 8 * WINDOW_TICKS)
        assert caller.margins_ms[late - 1] < 15 < caller.margins_ms[late + 1]  # grown past the lead by the late piece
        assert np.isnan(waits[late]) and abs(waits[late + 1] - 95.0) < 0.05
        np.testing.assert_allclose(waits[late + 1 + back_within :], 15.0, atol=0.05)
        assert caller.framer.dropped == N  # the piece the silent tick stood for, no more
        heard = (len(waits) - 1) * N
        assert heard + caller.framer.dropped + caller.framer.pending == caller.boundary


def test_a_caller_of_whole_frames_with_one_near_miss_a_window_is_not_kept_a_piece_back():
    # 25 ms before the tick, and one piece in every window comes 21 ms late (4 ms before its tick: inside the margin's
    # floor, yet in time). Piece 100 misses its tick and 101 lands 2 ms before its own, so the take after the miss
    # leaves a frame standing. A frame a piece back costs every frame a period, and a client of whole frames can
    # keep nothing between: at the window after next its frames end at the newest piece again (quiet at once,
    # speech through the gaps). Judged by the window's worst take, they stood a piece back for the rest of the call.
    late = {k: 0.021 for k in range(5, 400, WINDOW_TICKS)} | {100: 0.040, 101: 0.023}
    for audio, back_by in ((None, 121), (syllables, 125)):
        caller = AdvisedCaller(0.025, follow=False, late=late, audio=audio)
        waits = caller.run(400)
        assert np.isnan(waits[100]) and waits[101] == pytest.approx(105.0, abs=0.05)
        np.testing.assert_allclose(waits[back_by:], 25.0, atol=0.05)
        assert caller.framer.dropped == N and caller.framer.short_frames == 0
        heard = (len(waits) - 1) * N
        assert heard + caller.framer.dropped + caller.framer.pending == caller.boundary


def margin_growth_at_a_shorter_piece(shorter_piece: int) -> tuple[bool, int]:
    """Whole frames 30 ms before the tick, piece 50 60 ms late, and piece ``shorter_piece`` shorter by the first move
    further that the advice asked for: whether the take that found it grew the margin, and the move (samples)."""
    now = 0.0
    framer = TickAlignedFramer(N, RATE, clock=lambda: now)
    boundary, piece, length, shorter, ticks, grew = 0, 0, N, 0, 0, None
    while piece <= shorter_piece + 1:
        arrival = (boundary + length) / RATE + (0.060 if piece == 50 else 0.0)
        tick_at = 0.080 * (ticks + 1) + 0.030
        if arrival <= tick_at:
            now = arrival
            framer.push(np.zeros(length, np.float32))
            boundary, piece = boundary + length, piece + 1
            length = N - shorter if piece == shorter_piece else N
            continue
        now, ticks, before = tick_at, ticks + 1, framer.margin
        framer.take()
        if not shorter and framer.advice and framer.advice.shift_ms < 0:
            shorter = round(-framer.advice.shift_ms * RATE / 1000)
        if piece == shorter_piece + 1:  # the take that found the shorter piece
            grew = framer.margin > before
    assert framer.short_frames == 1
    return grew, shorter


def test_a_short_take_counts_as_late_audio_again_once_the_advised_move_did_not_come():
    # Piece 50 comes 30 ms after its tick and the window's advice asks for a shorter piece. That much shorter within 3
    # windows it is the move: its short take leaves the margin as it was. The same shorter piece 4 windows on is
    # late audio of a client that did not follow, and the margin grows for it.
    assert margin_growth_at_a_shorter_piece(62)[0] is False
    grew, move = margin_growth_at_a_shorter_piece(50 + 4 * WINDOW_TICKS + 6)
    assert grew is True and move > 0


def test_a_late_piece_of_the_usual_length_grows_the_margin_while_a_shorter_piece_is_advised():
    # 10 ms pieces landing at the tick; three come late at the start of a window, and its end tells the caller to cut
    # a piece 40 ms shorter, which it never does. A short take in the next window is its late audio, not that
    # move: the margin grows for it. (It did not, for the three windows the move is waited for: the call page's late
    # pieces right after a late piece went unanswered.)
    caller = PieceCaller()
    framer, tick = caller.framer, caller.tick
    for _ in range(2 * WINDOW_TICKS):
        tick(8)
    tick(5)
    tick(11)
    for _ in range(WINDOW_TICKS - 2):
        tick(8)
    assert framer.advice.shift_ms <= -30.0  # -40 (half a period) on this clock, whatever a stall adds to the lead
    tick(8)
    margin_before = framer.margin
    assert tick(3).short and framer.margin > margin_before


def test_the_move_further_after_a_late_piece_is_at_most_half_a_period():
    # the margin at its cap after a very late piece, the pieces landing just before the tick: the goal is 70 ms away,
    # yet the move, as any (docs/protocol.md), is half a period at most
    adviser = PhaseAdviser(80.0)
    adviser.margin_grew(60.0)
    advice = adviser.window_ended(lead_ms=1.0, wait_ms=1.0, standing_ms=0.0, margin_ms=60.0, from_position=0)
    assert advice.shift_ms == -40.0


def test_a_follower_whose_pieces_land_at_the_tick_before_the_one_that_takes_them_is_moved_off_it():
    # 45 ms before the tick, piece 10 comes 97 ms late: the margin goes to its cap and the follower is moved 40 ms
    # further at once, which lands its pieces right at the tick before, 1 ms after it or 3 ms before it in turn. The
    # framer keeps each of them for the next tick, so every frame waits 85 ms. That window's smallest lead (3 ms,
    # a piece kept back) and its smallest depth (nothing, after a piece that came after its tick) come from
    # different takes; added up they read as frames at their tick, and the advice asked for nothing, for good.
    late = {k: (0.002, 0.006)[k % 2] for k in range(100 * WINDOW_TICKS)} | {5: 0.017, 10: 0.097}
    caller = AdvisedCaller(0.045, follow=True, late=late)
    waits = np.array(caller.run(75 * WINDOW_TICKS))  # past the calm the late piece asks for before a move closer
    assert caller.moves[0] == -40.0 and np.all(waits[14 : 2 * WINDOW_TICKS] > 80.0)  # moved, and a piece back
    assert len(caller.moves) > 1, "left a piece back for good"
    moved_off = caller.move_ticks[1]
    assert caller.moves[1] > 0 and moved_off <= 4 * WINDOW_TICKS  # cut longer: the tick after takes them in time
    assert np.all(waits[moved_off + WINDOW_TICKS :] < 80.0)
    assert np.all(waits[-3 * WINDOW_TICKS :] < GOAL_MS + 6.0 + ADVICE_MIN_MS)  # then at the goal, its jitter beside
    # the stream stays whole: every sample heard (the move further's one padded take held less), trimmed as quiet,
    # or still buffered
    takes, kept = len(waits) - np.isnan(waits).sum(), caller.framer.dropped + caller.framer.pending
    assert caller.framer.short_frames == 1 and (takes - 1) * N + kept < caller.boundary < takes * N + kept
