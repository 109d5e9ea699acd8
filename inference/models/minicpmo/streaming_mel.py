"""A session's log-mel, kept across units instead of recomputed over the whole buffer every unit.

The reference computes the Whisper log-mel of the session's whole buffer (up to 30 s) every unit and keeps the
unit's frames. Only the newest frames change from one unit to the next, apart from two couplings: the floor
(``max - 8`` over every frame of the buffer) and the reflect padding of a centred STFT (the first two frames
mirror the buffer's start, the last one its end). On the H200 machine recomputing the whole buffer took a 1.8 ms
median but 30-77 ms in one unit in eight, the tail of the listen unit (a7bd560, bench/notes/unit-gpu.md; the
spikes were the host's 16 torch threads meeting the GPU work, bench/results/unit-host-threads-h200-897b290.json). ``MelCache`` keeps the pre-floor log-mel and each frame's peak, and each unit recomputes only what
changed: the block holding the previous last frame onward, and the first block after a slide.

Frames are computed in blocks of ``BLOCK_FRAMES`` aligned to the buffer's first frame. A block's bits depend on
how many frames it holds (the BLAS and FFT kernels pick their paths by size), so the definition is blockwise: the
cache equals a blockwise recomputation of the whole buffer bit for bit (tests/inference/models/minicpmo/
test_streaming_mel.py), whatever the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

N_FFT = 400
HOP = 160
PAD = N_FFT // 2  # a centred STFT reflects this many samples at each end
BLOCK_FRAMES = 100  # one unit's core frames; divides the 10 s (1000-frame) slide, so blocks survive it


def padded_slice(buffer: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``np.pad(buffer, PAD, mode="reflect")[lo:hi]`` without padding the whole buffer."""
    n = buffer.shape[0]
    if lo >= PAD and hi <= n + PAD:
        return buffer[lo - PAD : hi - PAD]
    index = np.abs(np.arange(lo, hi) - PAD)  # the start mirrors without repeating sample 0
    index = np.where(index > n - 1, 2 * (n - 1) - index, index)  # the end mirrors without repeating sample n-1
    return buffer[index]


def frames_in(samples: int) -> int:
    """Frames of a buffer of ``samples`` as the reference keeps them (a centred STFT's last frame dropped)."""
    return samples // HOP


@dataclass
class MelCache:
    """Pre-floor log10 mel of a session's mel buffer, block by block; ``frames`` of them are current."""

    log: torch.Tensor | None = None  # [n_mels, capacity]
    peaks: torch.Tensor | None = None  # [capacity]: each frame's largest value
    frames: int = 0
    _blocks_done: int = field(default=0, repr=False)  # leading blocks that hold all their frames, final

    def update(self, front_end, buffer: np.ndarray, dropped_frames: int) -> None:
        """Bring the cache to ``buffer``: the previous buffer with ``dropped_frames`` frames slid off its front
        and new samples appended (``front_end.frame_log_mel`` computes frames from padded samples)."""
        total = frames_in(buffer.shape[0])
        if self.log is None or dropped_frames % BLOCK_FRAMES or dropped_frames > self.frames:
            self._blocks_done = 0  # nothing, or nothing aligned, to keep
            self.frames = 0
        elif dropped_frames:
            kept = self.frames - dropped_frames
            self.log[:, :kept] = self.log[:, dropped_frames : self.frames].clone()
            self.peaks[:kept] = self.peaks[dropped_frames : self.frames].clone()
            self.frames = kept
            self._blocks_done = max(self._blocks_done - dropped_frames // BLOCK_FRAMES, 0)
        self._reserve(front_end, total)
        # A block is final once it is full and its last frame no longer mirrors the buffer's end; block 0 is
        # stale after a slide (its first frames mirror the new start).
        stale = range(self._blocks_done, -(-total // BLOCK_FRAMES))
        for block in sorted({0, *stale} if dropped_frames else set(stale)):
            start, stop = block * BLOCK_FRAMES, min((block + 1) * BLOCK_FRAMES, total)
            padded = padded_slice(buffer, start * HOP, (stop - 1) * HOP + N_FFT)
            values = front_end.frame_log_mel(padded)  # [n_mels, stop - start]
            self.log[:, start:stop] = values
            self.peaks[start:stop] = values.amax(dim=0)
        self.frames = total
        self._blocks_done = max(total - 1, 0) // BLOCK_FRAMES  # every block before the one with the last frame

    def _reserve(self, front_end, total: int) -> None:
        if self.log is not None and self.log.shape[1] >= total:
            return
        capacity = max(total, 2 * (0 if self.log is None else self.log.shape[1]), 4 * BLOCK_FRAMES)
        log = torch.empty(front_end.filters.shape[1], capacity)
        peaks = torch.empty(capacity)
        if self.log is not None and self.frames:
            log[:, : self.frames] = self.log[:, : self.frames]
            peaks[: self.frames] = self.peaks[: self.frames]
        self.log, self.peaks = log, peaks

    def scaled(self, start: int, stop: int, dynamic_floor: bool) -> torch.Tensor:
        """Frames ``start:stop`` as Whisper scales them: floored at the buffer's ``max - 8`` (or -10), then
        ``(log + 4) / 4`` (a new tensor)."""
        floor = self.peaks[: self.frames].max() - 8.0 if dynamic_floor else torch.tensor(-10.0)
        return (torch.maximum(self.log[:, start:stop], floor) + 4.0) / 4.0

    def nbytes(self) -> int:
        return 0 if self.log is None else self.log.nbytes + self.peaks.nbytes
