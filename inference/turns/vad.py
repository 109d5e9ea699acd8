"""Speech probabilities from Silero VAD (the TorchScript model shipped inside the ``silero-vad`` wheel).

Nothing is downloaded: the model file is read from the installed package once per process, and each
session gets its own loaded copy (the model keeps recurrent state between windows). The package's
``torchaudio`` dependency is not needed for this (and not installed: its wheels pin an older torch).
"""

from __future__ import annotations

import importlib.resources
import io
import warnings
from functools import cache

import numpy as np
import torch

RATE = 16_000
WINDOW = 512  # samples per probability at 16 kHz (Silero v5+ takes exactly this)
WINDOW_MS = 1000.0 * WINDOW / RATE


@cache
def _model_bytes() -> bytes:
    return (importlib.resources.files("silero_vad.data") / "silero_vad.jit").read_bytes()


class SileroVad:
    """One stream's speech probabilities: feed 16 kHz float audio of any length, get one value per window."""

    def __init__(self) -> None:
        with warnings.catch_warnings():  # torch 2.13 deprecates jit.load; the wheel ships TorchScript
            warnings.simplefilter("ignore", DeprecationWarning)
            self._model = torch.jit.load(io.BytesIO(_model_bytes()), map_location="cpu")
        self._model.eval()
        self._pending = np.zeros(0, np.float32)

    def probabilities(self, samples: np.ndarray) -> list[float]:
        """Probabilities of every whole window completed by ``samples`` (the remainder waits)."""
        audio = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        whole = audio.size // WINDOW * WINDOW
        self._pending = audio[whole:]
        if not whole:
            return []
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, whole, WINDOW):
                window = torch.from_numpy(audio[start : start + WINDOW].copy())
                out.append(float(self._model(window, RATE)))
        return out

    def reset(self) -> None:
        self._model.reset_states()
        self._pending = np.zeros(0, np.float32)
