"""Integrated loudness (ITU-R BS.1770-4, LUFS) and loudness normalisation.

Used to level voice prompts to -24 LUFS before Mimi encoding, as the PersonaPlex reference does with pyloudnorm.
The measurement follows the standard: K-weighting (a +4 dB high shelf near 1.5 kHz, then a 38 Hz high-pass),
mean square over 400 ms blocks with 75 % overlap, an absolute gate at -70 LUFS and a relative gate 10 LU below
the absolutely-gated level. The two K-weighting biquads are designed for the signal's own sample rate with the
RBJ cookbook formulas and the parameters pyloudnorm uses, so levels (and hence gains) agree with the reference.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import lfilter

__all__ = ["LoudnessError", "integrated_loudness", "normalize_loudness"]

BLOCK_SECONDS = 0.400
BLOCK_OVERLAP = 0.75
ABSOLUTE_GATE_LUFS = -70.0
RELATIVE_GATE_LU = -10.0
# Per-channel weights of BS.1770 (L, R, C, Ls, Rs).
CHANNEL_WEIGHTS = (1.0, 1.0, 1.0, 1.41, 1.41)


class LoudnessError(ValueError):
    """The audio cannot be measured: wrong type/shape, non-finite samples, or shorter than one 400 ms block."""


def _biquad(kind: str, gain_db: float, q: float, fc: float, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """RBJ audio-EQ-cookbook biquad, normalised so a[0] == 1."""
    amp = 10 ** (gain_db / 40.0)
    w0 = 2.0 * math.pi * (fc / rate)
    cos_w0 = math.cos(w0)
    alpha = math.sin(w0) / (2.0 * q)
    if kind == "high_shelf":
        root = 2 * math.sqrt(amp) * alpha
        b = [
            amp * ((amp + 1) + (amp - 1) * cos_w0 + root),
            -2 * amp * ((amp - 1) + (amp + 1) * cos_w0),
            amp * ((amp + 1) + (amp - 1) * cos_w0 - root),
        ]
        a = [(amp + 1) - (amp - 1) * cos_w0 + root, 2 * ((amp - 1) - (amp + 1) * cos_w0),
             (amp + 1) - (amp - 1) * cos_w0 - root]  # fmt: skip
    elif kind == "high_pass":
        b = [(1 + cos_w0) / 2, -(1 + cos_w0), (1 + cos_w0) / 2]
        a = [1 + alpha, -2 * cos_w0, 1 - alpha]
    else:
        raise AssertionError(f"unknown biquad {kind}")
    b_arr, a_arr = np.array(b), np.array(a)
    return b_arr / a_arr[0], a_arr / a_arr[0]


def _as_channels(pcm: np.ndarray, sample_rate: int) -> np.ndarray:
    """Validate and view the audio as [channels, samples] (input is [T] mono or [C, T])."""
    if not isinstance(pcm, np.ndarray):
        raise LoudnessError(f"audio must be a numpy array, got {type(pcm).__name__}")
    if not np.issubdtype(pcm.dtype, np.floating):
        raise LoudnessError(f"audio must be floating point, got {pcm.dtype}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer) or sample_rate <= 0:
        raise LoudnessError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    if pcm.ndim == 1:
        pcm = pcm[None, :]
    if pcm.ndim != 2 or not 1 <= pcm.shape[0] <= len(CHANNEL_WEIGHTS):
        raise LoudnessError(f"audio must be [T] or [C, T] with 1..5 channels, got shape {pcm.shape}")
    if pcm.shape[1] < BLOCK_SECONDS * sample_rate:
        raise LoudnessError(f"audio must be at least {BLOCK_SECONDS} s long, got {pcm.shape[1]} samples")
    if not np.isfinite(pcm).all():
        raise LoudnessError("audio contains NaN or infinite samples")
    return pcm


def integrated_loudness(pcm: np.ndarray, sample_rate: int) -> float:
    """Gated integrated loudness in LUFS; `-inf` for digital silence.

    Args:
        pcm: float samples, [T] mono or [C, T] channels-first (L, R, C, Ls, Rs order).
        sample_rate: in Hz.
    """
    pcm = _as_channels(pcm, sample_rate)
    # Filtered signals are stored back in the input's dtype between the two stages, as pyloudnorm does,
    # so float32 input gives the same level (and gain) as the reference.
    weighted = pcm.copy()
    for kind, gain_db, q, fc in (("high_shelf", 4.0, 1 / math.sqrt(2), 1500.0), ("high_pass", 0.0, 0.5, 38.0)):
        b, a = _biquad(kind, gain_db, q, fc, sample_rate)
        for ch in range(weighted.shape[0]):
            weighted[ch] = lfilter(b, a, weighted[ch])

    num_samples = weighted.shape[1]
    step = 1.0 - BLOCK_OVERLAP
    num_blocks = int(np.round((num_samples / sample_rate - BLOCK_SECONDS) / (BLOCK_SECONDS * step))) + 1
    block_energy = np.zeros((weighted.shape[0], num_blocks))  # [C, J] mean square per 400 ms block
    for j in range(num_blocks):
        lo = int(BLOCK_SECONDS * (j * step) * sample_rate)
        hi = int(BLOCK_SECONDS * (j * step + 1) * sample_rate)
        block_energy[:, j] = np.sum(np.square(weighted[:, lo:hi]), axis=1) / (BLOCK_SECONDS * sample_rate)

    weights = np.array(CHANNEL_WEIGHTS[: weighted.shape[0]])[:, None]
    with np.errstate(divide="ignore"):
        block_lufs = -0.691 + 10.0 * np.log10(np.sum(weights * block_energy, axis=0))  # [J]

    def gated_level(keep: np.ndarray) -> float:
        if not keep.any():
            return -math.inf
        mean_energy = block_energy[:, keep].mean(axis=1, keepdims=True)
        with np.errstate(divide="ignore"):
            return float(-0.691 + 10.0 * np.log10(np.sum(weights * mean_energy)))

    above_absolute = block_lufs >= ABSOLUTE_GATE_LUFS
    relative_gate = gated_level(above_absolute) + RELATIVE_GATE_LU
    return gated_level((block_lufs > relative_gate) & (block_lufs > ABSOLUTE_GATE_LUFS))


def normalize_loudness(pcm: np.ndarray, sample_rate: int, target_lufs: float = -24.0) -> np.ndarray:
    """Scale the audio so its integrated loudness is `target_lufs`.

    The gain is computed in float64 and the result returned in the input's dtype. Silent audio (no block above
    the absolute gate) has no defined loudness and is returned unchanged. Samples may exceed [-1, 1] afterwards,
    as in the reference (which only warns).
    """
    if not isinstance(target_lufs, int | float) or not math.isfinite(target_lufs):
        raise LoudnessError(f"target_lufs must be a finite number, got {target_lufs!r}")
    level = integrated_loudness(pcm, sample_rate)
    if not math.isfinite(level):
        return pcm.copy()
    gain = 10.0 ** ((target_lufs - level) / 20.0)
    return (gain * pcm.astype(np.float64)).astype(pcm.dtype)
