"""The serving bench's callers and what it reads from them: audio held while the model prepares (as the call page
holds its microphone), the service's input counters split into lost live frames, trims and prefill discards,
and the calls held over the hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.serving_analysis import analyse_echoes, calls_held, service_counters
from bench.serving_callers import FRAME_S, FRAME_SAMPLES, CallRecord, PhaseFollower, find_marks, marked_frame

ROOT = Path(__file__).resolve().parents[1]


def call(opened_at: float, closed_at: float, **counters: int) -> CallRecord:
    c = CallRecord(0, 1.0, np.full(4, np.nan), np.full(4, np.nan), session_id="s", opened_at=opened_at)
    c.closed_at, c.counters = closed_at, dict(counters)
    return c


def test_calls_held_counts_the_calls_open_at_each_step():
    calls = [call(0.0, 25.0), call(5.0, 100.0), call(12.0, 15.0), call(1.0, 0.0)]  # the last still open at the end
    calls.append(CallRecord(0, 1.0, np.zeros(1), np.zeros(1)))  # refused: no session, never held
    held = calls_held(calls, start=0.0, end=30.0, step_s=10.0)
    assert held["timeline"] == [1, 3, 3, 1] and held["mean"] == 2.0  # at the end, what is still open counts no more


def test_lost_live_frames_are_the_drops_less_trims_and_prefill_discards():
    calls = [call(0, 1, dropped_frames=9, trimmed_frames=4, prefill_dropped_frames=2, underruns=5)]
    calls.append(call(0, 1, dropped_frames=3, trimmed_frames=3))
    calls[1].frames_held = 11
    out = service_counters(calls)
    assert (out["dropped_frames"], out["trimmed_frames"], out["prefill_dropped_frames"]) == (12, 7, 2)
    assert out["lost_live_frames"] == 3 and out["frames_held_preparing"] == 11 and out["underruns"] == 5


def test_frames_held_back_are_neither_sent_late_nor_lost():
    c = call(0.0, 1.0)
    n = 20
    c.sent = 100.0 + np.arange(n) * 0.08
    c.echoed = c.sent + 0.03
    c.echoed[1] = np.nan  # sent before the caller heard of the prefill: the service discarded it
    c.prefill_noticed_at = c.sent[1] + 0.01
    c.sent[2:7] = c.echoed[2:7] = np.nan  # held while the model prepared
    c.echoed[12] = np.nan  # lost while live
    c.frames_sent = n
    frames = analyse_echoes([c], delay=0)
    assert frames["frames_sent_late_by_generator"] == 0 and frames["frames_sent_in_time"] == n - 2 - 5
    assert frames["frames_unheard_sent_before_prefill_notice"] == 1 and frames["frames_lost_sent_in_time"] == 1


def test_callers_hold_their_audio_while_the_model_prepares_and_lose_none_after(tmp_path):
    # A real daphne and service, echo engine with 12 ticks (~1 s) of simulated prefill per call.
    run = subprocess.run(
        [sys.executable, "bench/serving_e2e.py", "--lines", "2", "--ramp-s", "1", "--seconds", "6",
         "--daphnes", "1", "--services", "1", "--env", "PARLEY_ECHO_PREFILL_TICKS=12", "--recordings-sample", "0",
         "--env", "PARLEY_WEB_LOOP_LAG_MS=0",  # a busy suite machine must not turn these two callers away
         "--out-dir", str(tmp_path), "--what", "prefill-hold"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(next(tmp_path.glob("prefill-hold-*.json")).read_text())
    calls = result["callers"]["calls"]
    assert result["callers"]["calls_failed"] == 0 and calls >= 2
    counters = result["service_counters"]
    # Most of each prefill's ~12 frames are held by the caller; what was in flight before the first
    # session.prefill reached it (a frame or two) is what the service discards, counted once.
    assert counters["frames_held_preparing"] >= 6 * calls
    assert counters["prefill_dropped_frames"] <= 3 * calls
    assert counters["lost_live_frames"] == 0
    assert result["frames"]["frames_lost_sent_in_time"] == 0 and result["internal_error"] == 0


def test_frames_that_go_with_the_next_tick_are_counted_apart_from_the_stacks_tail():
    # Ticks at 100.04 s + k * 80 ms; a call at each millisecond of lead before the tick up to 70 (with a little
    # jitter; none sent just after a tick, where the grid's estimate could place it either side); every echo
    # leaves 9-11 ms after the tick that took its frame. The calls sending less than 4 ms before a tick miss it
    # (their frames reach the framer after it) and are echoed a tick later.
    rng = np.random.default_rng(0)
    period, n, calls = 0.08, 30, []
    ticks = 100.04 + np.arange(n) * period
    for lead_ms in range(1, 71):
        c = call(0.0, 1.0)
        c.sent = ticks - (lead_ms + rng.uniform(0.0, 0.9, n)) / 1000.0
        c.echoed = ticks + (period if lead_ms < 4 else 0.0) + rng.uniform(0.009, 0.011, n)
        c.frames_sent = n
        calls.append(c)
    frames = analyse_echoes(calls, delay=0)
    counted = frames["server_added_ms"]["n"]
    assert counted == 70 * (n - 2) and frames["frames_a_tick_later"] == round(3 / 70, 4)
    made = frames["server_added_made_tick_ms"]
    assert made["n"] == 67 * (n - 2) and made["p99"] < 20.0  # what the stack adds, the phase apart
    assert frames["server_added_ms"]["p99"] > 80.0  # the tail of all frames is the missed tick


def test_a_follower_moves_once_per_measurement_and_its_frame_keeps_its_mark():
    follower = PhaseFollower()
    follower.on_metrics({"input_shift_ms": 12.5, "input_shift_from_samples": 0})
    assert follower.take(sent_samples=4 * FRAME_SAMPLES, frame_samples=FRAME_SAMPLES, rate=24000) == 300
    assert follower.moved_at == 5 * FRAME_SAMPLES + 300
    # measured on audio from before that frame ended: stale, skipped; measured after it: taken
    follower.on_metrics({"input_shift_ms": -7.0, "input_shift_from_samples": 5 * FRAME_SAMPLES})
    assert follower.take(5 * FRAME_SAMPLES + 300, FRAME_SAMPLES, 24000) == 0
    follower.on_metrics({"input_shift_ms": -7.0, "input_shift_from_samples": 5 * FRAME_SAMPLES + 300})
    follower.on_metrics({"input_shift_ms": 0.0, "input_shift_from_samples": 6 * FRAME_SAMPLES})  # kept until used
    assert follower.take(6 * FRAME_SAMPLES, FRAME_SAMPLES, 24000) == -168
    speech = (np.arange(50_000) % 1000).astype("<i2")
    for extra in (300, -168):
        frame = np.frombuffer(marked_frame(speech, 123, 7, extra)[1:], "<i2").astype(np.int32)
        assert len(frame) == FRAME_SAMPLES + extra and list(find_marks(frame)) == [7]
        plain = np.frombuffer(marked_frame(speech, 123, 7)[1:], "<i2")
        np.testing.assert_array_equal(frame[: min(len(frame), FRAME_SAMPLES)], plain[: len(frame)])


def test_a_followers_moves_shift_its_schedule_not_its_lateness():
    sent = 10.0 + np.arange(10) * FRAME_S
    sent[3:] += 0.060  # frame 3 cut 60 ms later: it and the rest go 60 ms after the first schedule
    c = CallRecord(0, 1.0, sent, sent + 0.03, session_id="s", frames_sent=10)
    assert analyse_echoes([c], delay=0)["frames_sent_late_by_generator"] == 5  # frames 3-7 (the last two uncounted)
    c.moves = [(3, 0.060)]
    frames = analyse_echoes([c], delay=0)
    assert frames["frames_sent_late_by_generator"] == 0 and frames["frames_sent_in_time"] == 8
    assert frames["phase_moves"] == {
        "calls_moved": 1,
        "moves": 1,
        "abs_shift_ms": {"n": 1, "p50": 60.0, "p90": 60.0, "max": 60.0},
    }
