"""OpenAI ``server_vad`` semantics over a stream of speech probabilities (pure logic, no torch).

Speech starts at the first window whose probability reaches ``threshold``; it stops once the
probability has stayed below ``threshold - 0.15`` (Silero's own hysteresis) for
``silence_duration_ms``. Positions are milliseconds of the session's input stream, as OpenAI's
``audio_start_ms`` / ``audio_end_ms``: the start is where speech began (the committed turn reaches
``prefix_padding_ms`` further back), the end is where the silence began, not when it was confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.contracts import TurnDetection

HYSTERESIS = 0.15  # Silero's get_speech_timestamps: neg_threshold = threshold - 0.15
MIN_NEG_THRESHOLD = 0.01


@dataclass(frozen=True)
class SpeechStart:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStop:
    audio_end_ms: int


class TurnDetector:
    """Feed it one probability per VAD window, in order; it says where turns start and stop.

    Args:
        config: the session's ``server_vad`` settings.
        window_ms: the duration of one probability window (32 ms for Silero at 16 kHz).
    """

    def __init__(self, config: TurnDetection, window_ms: float):
        self.config = config
        self.window_ms = window_ms
        self._windows = 0  # windows seen so far: the stream position
        self._speaking = False
        self._silence_from: int | None = None  # window index where the current silence began

    @property
    def speaking(self) -> bool:
        return self._speaking

    def feed(self, probability: float) -> SpeechStart | SpeechStop | None:
        index = self._windows
        self._windows += 1
        threshold = self.config.threshold
        if not self._speaking:
            if probability >= threshold:
                self._speaking, self._silence_from = True, None
                return SpeechStart(round(index * self.window_ms))
            return None
        if probability >= max(threshold - HYSTERESIS, MIN_NEG_THRESHOLD):
            self._silence_from = None
            return None
        if self._silence_from is None:
            self._silence_from = index
        if (self._windows - self._silence_from) * self.window_ms >= self.config.silence_duration_ms:
            self._speaking = False
            end, self._silence_from = self._silence_from, None
            return SpeechStop(round(end * self.window_ms))
        return None
