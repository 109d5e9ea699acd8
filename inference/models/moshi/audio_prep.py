"""Voice-prompt audio preparation: read a wav, resample to 24 kHz mono, normalise to -24 LUFS.

Integrated loudness follows ITU-R BS.1770-4 (K-weighting = high shelf + high pass biquads, 400 ms blocks
with 75 % overlap, absolute gate -70 LUFS, relative gate -10 LU), with the float32/float64 staging the
PersonaPlex reference gets from its loudness meter, so the normalised samples match it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import soundfile
from scipy.signal import lfilter, resample_poly

SAMPLE_RATE = 24000
TARGET_LUFS = -24.0


class AudioPrepError(ValueError):
    """The audio file cannot be read or is unusable (empty, not finite)."""


def _biquad(kind: str, gain_db: float, q: float, fc: float, rate: int) -> tuple[np.ndarray, np.ndarray]:
    a_gain = 10 ** (gain_db / 40.0)
    w0 = 2.0 * math.pi * (fc / rate)
    alpha = math.sin(w0) / (2.0 * q)
    cos_w0 = math.cos(w0)
    if kind == "high_shelf":
        sa = 2 * math.sqrt(a_gain) * alpha
        b = [
            a_gain * ((a_gain + 1) + (a_gain - 1) * cos_w0 + sa),
            -2 * a_gain * ((a_gain - 1) + (a_gain + 1) * cos_w0),
            a_gain * ((a_gain + 1) + (a_gain - 1) * cos_w0 - sa),
        ]
        a = [(a_gain + 1) - (a_gain - 1) * cos_w0 + sa, 2 * ((a_gain - 1) - (a_gain + 1) * cos_w0),
             (a_gain + 1) - (a_gain - 1) * cos_w0 - sa]  # fmt: skip
    else:  # high_pass
        b = [(1 + cos_w0) / 2, -(1 + cos_w0), (1 + cos_w0) / 2]
        a = [1 + alpha, -2 * cos_w0, 1 - alpha]
    b_arr, a_arr = np.array(b) / a[0], np.array(a) / a[0]
    return b_arr, a_arr


def integrated_loudness(pcm: np.ndarray, rate: int) -> float:
    """BS.1770-4 integrated loudness (LUFS) of mono ``pcm``; -inf for silence."""
    block, overlap = 0.4, 0.75
    data = np.array(pcm, copy=True)
    if data.shape[0] < int(block * rate):
        raise AudioPrepError(f"audio is shorter than one {block} s loudness block")
    for kind, gain, q, fc in (("high_shelf", 4.0, 1 / math.sqrt(2), 1500.0), ("high_pass", 0.0, 0.5, 38.0)):
        b, a = _biquad(kind, gain, q, fc, rate)
        data[:] = lfilter(b, a, data)  # stored back in the input dtype, as the reference meter does
    step = 1.0 - overlap
    num_blocks = int(np.round(((data.shape[0] / rate) - block) / (block * step))) + 1
    z = np.zeros(num_blocks)
    for j in range(num_blocks):
        lo, hi = int(block * (j * step) * rate), int(block * (j * step + 1) * rate)
        z[j] = (1.0 / (block * rate)) * np.sum(np.square(data[lo:hi]))
    with np.errstate(divide="ignore"):
        levels = -0.691 + 10.0 * np.log10(z)
    gated = levels >= -70.0
    if not gated.any():
        return float("-inf")
    relative = -0.691 + 10.0 * np.log10(np.mean(z[gated])) - 10.0
    keep = (levels > relative) & (levels > -70.0)
    if not keep.any():
        return float("-inf")
    return float(-0.691 + 10.0 * np.log10(np.mean(z[keep])))


def normalize_loudness(pcm: np.ndarray, rate: int, target_lufs: float = TARGET_LUFS) -> np.ndarray:
    """Scale ``pcm`` to ``target_lufs`` (float64 gain, float32 result); silence is returned unchanged."""
    loudness = integrated_loudness(pcm, rate)
    if not math.isfinite(loudness):
        return pcm.astype(np.float32)
    gain = np.power(10.0, (target_lufs - loudness) / 20.0)
    return (gain * pcm).astype(np.float32)


def load_wav_24k(path: str | Path) -> np.ndarray:
    """float32 mono [N] at 24 kHz (first channel of a multi-channel file)."""
    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError, soundfile.LibsndfileError) as exc:
        raise AudioPrepError(f"{path}: not a readable audio file ({exc})") from exc
    pcm = data[:, 0]
    if pcm.size == 0 or not np.isfinite(pcm).all():
        raise AudioPrepError(f"{path}: empty or non-finite audio")
    if rate != SAMPLE_RATE:
        g = math.gcd(int(rate), SAMPLE_RATE)
        pcm = resample_poly(pcm, SAMPLE_RATE // g, int(rate) // g).astype(np.float32)
    return pcm


def load_voice_wav(path: str | Path) -> np.ndarray:
    """A voice-prompt wav as the reference prepares it: 24 kHz mono, normalised to -24 LUFS."""
    return normalize_loudness(load_wav_24k(path), SAMPLE_RATE)
