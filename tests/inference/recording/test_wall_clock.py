"""lay_out: engine steps on the call's wall clock, with the silences between them named."""

import pytest

from inference.recording.wall_clock import lay_out

P = 0.08


def ticks(walls):
    """TICK records: each step took 1 ms and was done at its wall time (so its tick began 1 ms before)."""
    return [(step, wall, 1.0) for step, wall in enumerate(walls)]


def test_steps_a_few_ms_late_are_laid_end_to_end_without_gaps():
    walls = [P * (k + 1) + 0.004 * k for k in range(10)]  # each tick 4 ms later than the last: 36 ms drift
    timeline = lay_out(ticks(walls), period_s=P, events=[], caller_steps=None, end_s=None)
    assert timeline.gaps == [] and timeline.starts == pytest.approx([0.079 + k * P for k in range(10)])


def test_late_ticks_become_marked_silence_and_the_duration_is_the_calls():
    walls = [0.08, 0.16, 0.24, 1.24, 1.32]  # the host stalled for a second after step 2
    timeline = lay_out(ticks(walls), period_s=P, events=[], caller_steps=None, end_s=1.45)
    assert timeline.gaps[0] == {"t": 0.319, "end": 1.239, "cause": "engine_behind"}
    assert timeline.starts[3] == pytest.approx(1.239) and timeline.duration_s == pytest.approx(1.45)


def test_a_pause_is_named_and_a_caller_who_left_adds_no_tail():
    walls = [0.08, 0.16, 2.16, 2.24]
    events = [{"k": "pause", "step": 2}, {"k": "resume", "step": 2}, {"k": "detach", "step": 4}]
    timeline = lay_out(ticks(walls), period_s=P, events=events, caller_steps=None, end_s=32.0)
    assert [g["cause"] for g in timeline.gaps] == ["pause"]
    assert timeline.duration_s == pytest.approx(2.239 + P)  # not the 30 s grace after the caller left


def test_steps_without_caller_audio_are_a_gap_when_they_run_long_enough():
    walls = [P * (k + 1) for k in range(12)]
    caller = {0, 1, 2, 6, 7, 9, 10, 11}  # 3..5 missing (a gap), 8 missing (one underrun: jitter, not a gap)
    timeline = lay_out(ticks(walls), period_s=P, events=[], caller_steps=caller, end_s=None)
    assert timeline.gaps == [{"t": pytest.approx(0.319), "end": pytest.approx(0.559), "cause": "no_caller_audio"}]


def test_a_chat_recording_keeps_its_audio_end_to_end():
    walls = [0.1, 0.1, 60.0, 60.0]  # two replies a minute apart
    timeline = lay_out(ticks(walls), period_s=P, events=[{"k": "chat"}], caller_steps=None, end_s=90.0)
    assert timeline.gaps == [] and timeline.duration_s == pytest.approx(4 * P)
