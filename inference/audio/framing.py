"""Fixed-size frame accumulator: any append length in, whole engine chunks out."""

from __future__ import annotations

import numpy as np


class FrameAccumulator:
    """Collects samples into fixed-size frames without growing buffers.

    Args:
        frame_samples: samples per emitted frame (the engine's ``input_chunk_samples``).
    """

    def __init__(self, frame_samples: int):
        if frame_samples < 1:
            raise ValueError(f"frame_samples must be >= 1, got {frame_samples}")
        self.frame_samples = frame_samples
        self._buffer = np.zeros(frame_samples, dtype=np.float32)
        self._filled = 0

    @property
    def pending(self) -> int:
        """Samples held back until the next frame is complete."""
        return self._filled

    def push(self, samples: np.ndarray) -> list[np.ndarray]:
        """Add samples; return every frame completed by them (each a fresh float32 array)."""
        frames: list[np.ndarray] = []
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        pos = 0
        while pos < len(samples):
            take = min(self.frame_samples - self._filled, len(samples) - pos)
            self._buffer[self._filled : self._filled + take] = samples[pos : pos + take]
            self._filled += take
            pos += take
            if self._filled == self.frame_samples:
                frames.append(self._buffer.copy())
                self._filled = 0
        return frames
