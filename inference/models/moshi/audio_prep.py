"""Voice-prompt audio preparation, with the PersonaPlex reference's own libraries: ``sphn`` reads the file and
resamples it to 24 kHz, ``pyloudnorm`` levels it to -24 LUFS (BS.1770-4).

Mono files give the reference's samples exactly, so their Mimi codes are the reference's at any input rate
(tests/inference/models/moshi/test_voice_prep_parity.py). The reference encodes only the first channel of a
multi-channel file, but its loudness step refuses such a file ("five channels or less": it hands pyloudnorm
[C, T]); here the first channel is taken before levelling, which is what the reference does with a mono file of
that channel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import sphn

from inference.audio.loudness import normalize_loudness

SAMPLE_RATE = 24000
TARGET_LUFS = -24.0


class AudioPrepError(ValueError):
    """The audio file cannot be read or is unusable (empty, not finite)."""


def resample_24k(pcm: np.ndarray, rate: int) -> np.ndarray:
    """float32 [..., T] at ``rate`` to 24 kHz with sphn, as the reference's ``load_audio`` does (its output is a
    little longer than ``T * 24000 / rate``: sphn flushes its last chunk)."""
    if rate == SAMPLE_RATE:
        return np.ascontiguousarray(pcm, dtype=np.float32)
    out = sphn.resample(np.ascontiguousarray(pcm, dtype=np.float32), src_sample_rate=rate, dst_sample_rate=SAMPLE_RATE)
    return np.asarray(out, dtype=np.float32)


def load_wav_24k(path: str | Path) -> np.ndarray:
    """float32 mono [N] at 24 kHz (the first channel of a multi-channel file), read and resampled with sphn."""
    try:
        data, rate = sphn.read(str(path))  # [C, T] float32
    except (OSError, RuntimeError, ValueError) as exc:
        raise AudioPrepError(f"{path}: not a readable audio file ({exc})") from exc
    pcm = np.asarray(data, dtype=np.float32)
    if pcm.ndim != 2 or pcm.size == 0 or not np.isfinite(pcm).all():
        raise AudioPrepError(f"{path}: empty or non-finite audio")
    return resample_24k(pcm[:1], int(rate))[0]


def load_voice_wav(path: str | Path) -> np.ndarray:
    """A voice-prompt wav as the reference prepares it: 24 kHz mono, normalised to -24 LUFS."""
    return normalize_loudness(load_wav_24k(path), SAMPLE_RATE, TARGET_LUFS)
