"""Turn-taking metrics on synthetic two-track calls whose overlaps, gaps and interruptions are known."""

from __future__ import annotations

import numpy as np
import pytest

from webapp.recordings.turn_taking import TurnTakingError, measure, voice_activity

RATE = 16000
TOLERANCE_S = 0.04

# (start, end) seconds of speech on each track. The script of the call:
#   caller asks 0.5-2.0; agent answers after 350 ms (2.35-4.0);
#   the caller interrupts at 3.5 and the agent yields 0.5 s later (overlap 3.5-4.0);
#   agent answers after 600 ms (5.6-7.0); caller answers after 1.0 s (8.0-9.5), the agent says
#   "mhm" inside it (8.8-9.2, a backchannel), the caller pauses 0.8 s (9.5-10.3) and goes on to 11.0;
#   agent answers after 250 ms (11.25-12.5); caller 13.0-14.5 and the agent cuts in at 14.2 (0.3 s);
#   agent talks 14.2-19.0 and the caller's interruption 16.5-18.0 does not stop it.
CALLER_SPEECH = [(0.5, 2.0), (3.5, 5.0), (8.0, 9.5), (10.3, 11.0), (13.0, 14.5), (16.5, 18.0)]
AGENT_SPEECH = [(2.35, 4.0), (5.6, 7.0), (8.8, 9.2), (11.25, 12.5), (14.2, 19.0)]
DURATION_S = 20.0


def speech_like(spans, seed: int) -> np.ndarray:
    """int16 track: noise at -20 dBFS with a 4 Hz syllable envelope inside each span, -70 dBFS elsewhere."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S * RATE)
    track = rng.normal(0, 10 ** (-70 / 20), n)
    t = np.arange(n) / RATE
    for start, end in spans:
        inside = (t >= start) & (t < end)
        syllables = 0.55 + 0.45 * np.abs(np.sin(2 * np.pi * 2 * (t[inside] - start)))  # never below -7 dB
        track[inside] = rng.normal(0, 10 ** (-20 / 20), inside.sum()) * syllables
    return np.clip(np.round(track * 32767), -32768, 32767).astype(np.int16)


@pytest.fixture(scope="module")
def metrics():
    events = [{"k": "epoch", "step": 45, "epoch": 1}, {"k": "epoch", "step": 70, "epoch": 2, "response": True}]
    return measure(speech_like(CALLER_SPEECH, 1), speech_like(AGENT_SPEECH, 2), RATE, events=events, period_ms=80)


def test_the_detector_finds_each_utterance_edge():
    found = voice_activity(speech_like(CALLER_SPEECH, 3), RATE)
    assert len(found) == len(CALLER_SPEECH)
    for (start, end), (true_start, true_end) in zip(found, CALLER_SPEECH, strict=True):
        assert start == pytest.approx(true_start, abs=TOLERANCE_S) and end == pytest.approx(true_end, abs=TOLERANCE_S)


def test_response_latencies_are_the_silences_before_each_agent_turn(metrics):
    assert metrics["response_latency_s"] == pytest.approx([0.35, 0.6, 0.25], abs=TOLERANCE_S)
    assert metrics["response_latency_mean_s"] == pytest.approx(0.4, abs=TOLERANCE_S)
    assert metrics["caller_response_latency_s"] == pytest.approx([1.0, 0.5], abs=TOLERANCE_S)  # 7->8, 12.5->13
    # Where each lies, for the review's strip: from the caller's stop, as long as the latency.
    assert [r["start"] for r in metrics["responses"]] == pytest.approx([2.0, 5.0, 11.0], abs=TOLERANCE_S)
    assert [r["length_s"] for r in metrics["responses"]] == metrics["response_latency_s"]


def test_overlaps_say_who_cut_whom_and_for_how_long(metrics):
    overlaps = metrics["overlaps"]
    assert [o["cut_in"] for o in overlaps] == ["caller", "agent", "caller"]
    assert [o["start"] for o in overlaps] == pytest.approx([3.5, 14.2, 16.5], abs=TOLERANCE_S)
    assert [o["length_s"] for o in overlaps] == pytest.approx([0.5, 0.3, 1.5], abs=TOLERANCE_S)
    assert metrics["caller_cut_in"] == 2 and metrics["agent_cut_in"] == 1
    assert metrics["overlap_s"] == pytest.approx(2.3, abs=TOLERANCE_S)


def test_interruptions_the_agent_yielded_to_and_held(metrics):
    interruptions = metrics["interruptions"]
    assert [i["yielded"] for i in interruptions] == [True, False]
    assert interruptions[0]["stop_latency_s"] == pytest.approx(0.5, abs=TOLERANCE_S)
    assert interruptions[1]["stop_latency_s"] is None
    assert metrics["interruptions_yielded"] == 1


def test_a_short_agent_utterance_under_the_caller_is_a_backchannel_not_a_turn(metrics):
    assert metrics["agent_backchannels"] == 1 and metrics["caller_backchannels"] == 0
    _, start, end = metrics["backchannels"][0]
    assert start == pytest.approx(8.8, abs=TOLERANCE_S) and end == pytest.approx(9.2, abs=TOLERANCE_S)


def test_a_silence_inside_the_callers_turn_is_a_pause(metrics):
    assert len(metrics["pauses"]) == 1
    pause = metrics["pauses"][0]
    assert pause["speaker"] == "caller"
    assert pause["start"] == pytest.approx(9.5, abs=TOLERANCE_S)
    assert pause["length_s"] == pytest.approx(0.8, abs=TOLERANCE_S)


def test_talk_times_and_ratio(metrics):
    caller_s = sum(e - s for s, e in CALLER_SPEECH)
    agent_s = sum(e - s for s, e in AGENT_SPEECH)
    assert metrics["caller_talk_s"] == pytest.approx(caller_s, abs=len(CALLER_SPEECH) * TOLERANCE_S)
    assert metrics["agent_talk_s"] == pytest.approx(agent_s, abs=len(AGENT_SPEECH) * TOLERANCE_S)
    assert metrics["talk_ratio"] == pytest.approx(agent_s / (caller_s + agent_s), abs=0.01)


def test_the_engines_recorded_barge_ins_are_listed_and_new_responses_are_not(metrics):
    assert metrics["engine_barge_ins"] == [3.6]  # step 45 at 80 ms


def test_silent_and_empty_calls_measure_to_nothing_without_failing():
    silent = measure(np.zeros(RATE, np.int16), np.zeros(0, np.int16), RATE)
    assert silent["segments"] == [] and silent["talk_ratio"] is None and silent["response_latency_mean_s"] is None


@pytest.mark.parametrize(
    ("track", "rate"), [(np.zeros((10, 2), np.int16), RATE), (np.zeros(10, np.int16), 0)], ids=["stereo", "rate-0"]
)
def test_bad_tracks_are_a_typed_error(track, rate):
    with pytest.raises(TurnTakingError):
        measure(track, np.zeros(10, np.int16), rate)
