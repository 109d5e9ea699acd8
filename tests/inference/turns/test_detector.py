"""Server VAD turn boundaries on espeak-ng speech with known silences: within 100 ms of the true ones.

Silero VAD (the model packaged in the silero-vad wheel) feeds the OpenAI ``server_vad`` detector in
20 ms pieces, as a client's appends would. Measured here (Silero 6.2.3, defaults 0.5 / 300 / 500):
starts 1-32 ms late, ends 17-88 ms late (Silero's probability decays a few windows after speech ends).
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.contracts import TurnDetection
from inference.turns.detector import SpeechStart, SpeechStop, TurnDetector
from inference.turns.vad import RATE, WINDOW_MS, SileroVad
from tests.turn_audio import speech_with_silences, utterance

TOLERANCE_MS = 100.0
PIECE = RATE // 50  # 20 ms appends


def detect(audio: np.ndarray, config: TurnDetection) -> list[SpeechStart | SpeechStop]:
    vad, detector = SileroVad(), TurnDetector(config, WINDOW_MS)
    events = []
    for start in range(0, audio.size, PIECE):
        for probability in vad.probabilities(audio[start : start + PIECE]):
            if (event := detector.feed(probability)) is not None:
                events.append(event)
    return events


def test_boundaries_within_100_ms_of_the_true_ones():
    audio, truth = speech_with_silences()
    events = detect(audio, TurnDetection())
    assert [type(e) for e in events] == [SpeechStart, SpeechStop] * len(truth), events
    found = [(a.audio_start_ms, b.audio_end_ms) for a, b in zip(events[::2], events[1::2], strict=True)]
    errors = [
        (start - true_start, end - true_end) for (start, end), (true_start, true_end) in zip(found, truth, strict=True)
    ]
    print("boundary errors (start, end) ms:", [(round(s, 1), round(e, 1)) for s, e in errors])
    assert all(abs(s) <= TOLERANCE_MS and abs(e) <= TOLERANCE_MS for s, e in errors), (found, truth)


def test_a_pause_shorter_than_silence_duration_does_not_end_the_turn():
    first, second = utterance("One two three."), utterance("Four five six.")
    pause = np.zeros(int(0.35 * RATE), np.float32)
    lead, tail = np.zeros(RATE // 2, np.float32), np.zeros(RATE, np.float32)
    audio = np.concatenate([lead, first, pause, second, tail])
    events = detect(audio, TurnDetection(silence_duration_ms=500))
    assert [type(e) for e in events] == [SpeechStart, SpeechStop]
    # ... and a shorter silence_duration_ms splits the same audio into two turns.
    events = detect(audio, TurnDetection(silence_duration_ms=200))
    assert [type(e) for e in events] == [SpeechStart, SpeechStop] * 2


@pytest.mark.parametrize("threshold", [0.3, 0.9])
def test_silence_never_starts_a_turn(threshold):
    rng = np.random.default_rng(0)
    hiss = (0.003 * rng.standard_normal(3 * RATE)).astype(np.float32)  # a quiet room, not speech
    assert detect(hiss, TurnDetection(threshold=threshold)) == []
