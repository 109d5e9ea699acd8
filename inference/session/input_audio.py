"""The caller's audio on its way to the slot: decoded, at the engine's rate, and what of it was dropped."""

from __future__ import annotations

import time

import numpy as np

from inference.audio import pcm
from inference.audio.resample import StreamingResampler
from inference.contracts import ParleyError

BACKPRESSURE_REPORT_PERIOD_S = 1.0


class InputAudio:
    """One session's input stream: each append decoded and resampled, drops counted, overflow reported.

    Args:
        engine_rate: the engine's input rate (Hz); appends at other rates are resampled to it, statefully.
    """

    def __init__(self, engine_rate: int) -> None:
        self._engine_rate = engine_rate
        self._resampler: StreamingResampler | None = None
        self._last_backpressure = 0.0
        self.dropped = 0  # appends lost: inbox overflow and audio sent while paused

    def samples(self, data: bytes, encoding: str, rate: int) -> np.ndarray:
        """``data`` as float32 samples at the engine's rate (a format error is a typed ParleyError)."""
        pcm.check_format(encoding, rate)
        samples = pcm.decode(data, encoding)
        if rate == self._engine_rate:
            return samples
        if self._resampler is None or self._resampler.src_rate != rate:
            self._resampler = StreamingResampler(rate, self._engine_rate)
        # a resampling filter overshoots near full scale: clipped, so every stage after this sees [-1, 1]
        return np.clip(self._resampler.process(samples), -1.0, 1.0)

    def overflowed(self) -> None:
        """The slot's inbox took this append by dropping older audio: counted, and raised as
        ``input_backpressure`` at most once a second.

        Raised, not emitted as an event, so the error answers the append that overflowed (the realtime
        endpoint echoes that event's ``event_id``).
        """
        self.dropped += 1
        now = time.monotonic()
        if now - self._last_backpressure >= BACKPRESSURE_REPORT_PERIOD_S:
            self._last_backpressure = now
            raise ParleyError(
                f"input arrives faster than the engine consumes it; oldest audio dropped ({self.dropped} frames so far)",
                code="input_backpressure",
            )
