"""Voice-prompt audio preparation: read a wav, resample to 24 kHz mono, normalise to -24 LUFS (BS.1770-4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile

from inference.audio.loudness import normalize_loudness
from inference.audio.resample import resample_clip

SAMPLE_RATE = 24000
TARGET_LUFS = -24.0


class AudioPrepError(ValueError):
    """The audio file cannot be read or is unusable (empty, not finite)."""


def load_wav_24k(path: str | Path) -> np.ndarray:
    """float32 mono [N] at 24 kHz (first channel of a multi-channel file)."""
    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError, soundfile.LibsndfileError) as exc:
        raise AudioPrepError(f"{path}: not a readable audio file ({exc})") from exc
    pcm = data[:, 0]
    if pcm.size == 0 or not np.isfinite(pcm).all():
        raise AudioPrepError(f"{path}: empty or non-finite audio")
    return resample_clip(pcm, int(rate), SAMPLE_RATE)


def load_voice_wav(path: str | Path) -> np.ndarray:
    """A voice-prompt wav as the reference prepares it: 24 kHz mono, normalised to -24 LUFS."""
    return normalize_loudness(load_wav_24k(path), SAMPLE_RATE, TARGET_LUFS)
