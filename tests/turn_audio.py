"""Speech with known silences for the turn-detection tests: espeak-ng utterances between silent gaps.

The true turn boundaries are where each utterance's samples first and last reach 2 % of its peak
(espeak-ng pads its output with near-silence; that padding is not speech).
"""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
import soundfile

from inference.audio.resample import resample_clip

UTTERANCES = (
    "Hello there, how are you today?",
    "What is the weather like in Paris?",
    "Please tell me a short story.",
    "Thank you very much.",
)
GAPS_S = (0.8, 1.2, 0.9, 1.5, 1.0)  # silence before each utterance, and after the last


def utterance(text: str, rate: int = 16_000) -> np.ndarray:
    """One espeak-ng utterance at ``rate``, trimmed to its speech."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = subprocess.run(
        ["espeak-ng", "-v", "en", "-s", "160", "--stdout", text], capture_output=True, check=True, timeout=60
    ).stdout
    audio, source_rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    audio = resample_clip(audio, source_rate, rate)
    loud = np.flatnonzero(np.abs(audio) >= 0.02 * np.abs(audio).max())
    return audio[loud[0] : loud[-1] + 1]


def speech_with_silences(
    texts: tuple[str, ...] = UTTERANCES, gaps_s: tuple[float, ...] = GAPS_S, rate: int = 16_000
) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Audio at ``rate`` and the true (start_ms, end_ms) of each utterance in it."""
    assert len(gaps_s) == len(texts) + 1
    parts: list[np.ndarray] = []
    truth: list[tuple[float, float]] = []
    position = 0
    for index, gap in enumerate(gaps_s):
        silence = np.zeros(round(gap * rate), np.float32)
        parts.append(silence)
        position += silence.size
        if index < len(texts):
            speech = utterance(texts[index], rate)
            truth.append((1000.0 * position / rate, 1000.0 * (position + speech.size) / rate))
            parts.append(speech)
            position += speech.size
    return np.concatenate(parts), truth
