"""Streaming rational resampler (polyphase windowed-sinc FIR), numpy/scipy only; and whole-clip resampling (soxr).

Chunks of any size go in; the concatenated output equals resampling the whole signal at once,
so frame boundaries leave no clicks. Output sample n is aligned with input time n * src / dst (no
phase shift); the price is look-ahead: an output sample is emitted only once about ``zero_crossings``
input samples past it have arrived. It stays hand-written because a live call's resampler must hold back
under 1 ms of audio, and soxr's streaming mode holds back far more.

Whole clips (a MiniCPM-o reference voice) go through soxr at high quality, exactly as ``librosa.load(sr=...)``
(the MiniCPM-o reference's loader) resamples; PersonaPlex voice prompts use sphn instead, as their reference
does (inference/models/moshi/audio_prep.py).
"""

from __future__ import annotations

from math import ceil, gcd

import numpy as np
import soxr
from scipy.signal import firwin


class StreamingResampler:
    """Resamples a mono float32 stream from ``src_rate`` to ``dst_rate``.

    Args:
        src_rate: input sample rate (Hz).
        dst_rate: output sample rate (Hz).
        zero_crossings: half-length of the sinc filter, in zero crossings of the lower rate.
    """

    def __init__(self, src_rate: int, dst_rate: int, zero_crossings: int = 16):
        if src_rate <= 0 or dst_rate <= 0:
            raise ValueError("sample rates must be positive")
        g = gcd(src_rate, dst_rate)
        self.src_rate, self.dst_rate = src_rate, dst_rate
        self.up, self.down = dst_rate // g, src_rate // g  # output n sits at input time n * down / up
        self.identity = self.up == self.down
        if self.identity:
            return
        factor = max(self.up, self.down)
        num_taps = 2 * zero_crossings * factor + 1
        # Low-pass at the lower Nyquist, in the up-sampled domain; gain `up` restores the level.
        h = firwin(num_taps, 0.95 / factor, window=("kaiser", 8.0)) * self.up
        self._center = (num_taps - 1) // 2
        self._taps = -(-num_taps // self.up)  # input samples touched per output sample
        padded = np.zeros(self._taps * self.up)
        padded[:num_taps] = h
        # polyphase[p, i] multiplies x[j0 - i] when the output's phase is p.
        self._polyphase = padded.reshape(self._taps, self.up).T.astype(np.float32).copy()
        self._history = np.zeros(self._taps, dtype=np.float32)  # x[start .. start + len) with start < 0
        self._start = -self._taps  # absolute index of _history[0]
        self._next_out = 0  # absolute index of the next output sample

    def process(self, samples: np.ndarray) -> np.ndarray:
        """Feed input samples; return every output sample they make available."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self.identity:
            return samples.copy()
        buf = np.concatenate([self._history, samples])
        end = self._start + len(buf)  # one past the last available input index
        # Output n needs x[j0 - taps + 1 .. j0] with j0 = (n * down + center) // up.
        last_n = ((end - 1) * self.up - self._center) // self.down
        n = np.arange(self._next_out, last_n + 1, dtype=np.int64)
        if len(n):
            pos = n * self.down + self._center
            j0, phase = pos // self.up, pos % self.up
            idx = (j0 - self._start)[:, None] - np.arange(self._taps)[None, :]
            out = np.einsum("ni,ni->n", buf[idx], self._polyphase[phase])
            self._next_out = int(n[-1]) + 1
        else:
            out = np.zeros(0, dtype=np.float32)
        # Keep only what future outputs can still need.
        first_needed = (self._next_out * self.down + self._center) // self.up - self._taps + 1
        keep_from = max(0, min(first_needed - self._start, len(buf) - self._taps))
        self._history = buf[keep_from:].copy()
        self._start += keep_from
        return out.astype(np.float32, copy=False)


def resample_clip(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """A whole mono clip from ``src_rate`` to ``dst_rate`` as float32, as ``librosa.load(sr=dst_rate)`` does it:
    soxr at high quality, then cut or zero-padded to ``ceil(len * dst / src)`` samples (librosa's ``fix_length``)."""
    samples = np.asarray(samples, dtype=np.float32)
    if src_rate == dst_rate:
        return samples
    out = soxr.resample(samples, src_rate, dst_rate, quality="soxr_hq")
    size = int(ceil(samples.shape[-1] * float(dst_rate) / src_rate))
    if out.shape[-1] >= size:
        return np.ascontiguousarray(out[..., :size], dtype=np.float32)
    return np.pad(out, [(0, 0)] * (out.ndim - 1) + [(0, size - out.shape[-1])]).astype(np.float32)
