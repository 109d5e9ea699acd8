"""Integrated loudness (ITU-R BS.1770-4, LUFS) and loudness normalisation, measured by pyloudnorm.

Voice prompts are levelled to -24 LUFS before Mimi encoding with the very meter the PersonaPlex reference uses
(``pyloudnorm.Meter`` + ``pyloudnorm.normalize.loudness``), so the gain, and hence the Mimi codes, are the
reference's. This module only adds what the library leaves to its caller: typed errors for unusable audio (the
rest of the service carries on) and silence, which has no loudness and is returned unchanged.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyloudnorm

__all__ = ["LoudnessError", "integrated_loudness", "normalize_loudness"]

BLOCK_SECONDS = 0.400  # pyloudnorm's default gating block: shorter audio cannot be measured
MAX_CHANNELS = 5  # BS.1770's channel weights cover L, R, C, Ls, Rs


class LoudnessError(ValueError):
    """The audio cannot be measured: wrong type/shape, non-finite samples, or shorter than one 400 ms block."""


def _samples_by_channel(pcm: np.ndarray, sample_rate: int) -> np.ndarray:
    """Validate the audio ([T] mono or [C, T]) and return it as pyloudnorm takes it: [T] or [T, C]."""
    if not isinstance(pcm, np.ndarray):
        raise LoudnessError(f"audio must be a numpy array, got {type(pcm).__name__}")
    if not np.issubdtype(pcm.dtype, np.floating):
        raise LoudnessError(f"audio must be floating point, got {pcm.dtype}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer) or sample_rate <= 0:
        raise LoudnessError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    if pcm.ndim not in (1, 2) or (pcm.ndim == 2 and not 1 <= pcm.shape[0] <= MAX_CHANNELS):
        raise LoudnessError(f"audio must be [T] or [C, T] with 1..{MAX_CHANNELS} channels, got shape {pcm.shape}")
    if pcm.shape[-1] < BLOCK_SECONDS * sample_rate:
        raise LoudnessError(f"audio must be at least {BLOCK_SECONDS} s long, got {pcm.shape[-1]} samples")
    if not np.isfinite(pcm).all():
        raise LoudnessError("audio contains NaN or infinite samples")
    return pcm if pcm.ndim == 1 else pcm.T


def integrated_loudness(pcm: np.ndarray, sample_rate: int) -> float:
    """Gated integrated loudness in LUFS; ``-inf`` for digital silence.

    Args:
        pcm: float samples, [T] mono or [C, T] channels-first (L, R, C, Ls, Rs order).
        sample_rate: in Hz.
    """
    samples = _samples_by_channel(pcm, sample_rate)
    return float(pyloudnorm.Meter(sample_rate).integrated_loudness(samples))


def normalize_loudness(pcm: np.ndarray, sample_rate: int, target_lufs: float = -24.0) -> np.ndarray:
    """Scale the audio so its integrated loudness is ``target_lufs``, as the reference does; input's dtype out.

    Silent audio (no block above the absolute gate) has no defined loudness and is returned unchanged. Samples
    may exceed [-1, 1] afterwards, as in the reference (pyloudnorm only warns; the warning is silenced here).
    """
    if not isinstance(target_lufs, int | float) or not math.isfinite(target_lufs):
        raise LoudnessError(f"target_lufs must be a finite number, got {target_lufs!r}")
    level = integrated_loudness(pcm, sample_rate)
    if not math.isfinite(level):
        return pcm.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Possible clipped samples in output."
        levelled = pyloudnorm.normalize.loudness(pcm, level, target_lufs)
    return np.asarray(levelled).astype(pcm.dtype)
