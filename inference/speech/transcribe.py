"""Speech to timed words, behind one interface whose engine configuration picks.

- ``PocketSphinxTranscriber``, the embedded default: PocketSphinx's US-English model ships inside its
  PyPI wheel, so a deployment needs nothing downloaded. Measured 26 % WER on pocketsphinx-testdata's
  LibriVox sentences: enough to find a call by what the caller said, not a verbatim record.
- ``WhisperTranscriber``: faster-whisper over weights a deployment points ``PARLEY_WHISPER_WEIGHTS`` at
  (a CTranslate2 model folder). Imported only when chosen; nothing here downloads weights.

Used by recording post-processing (``inference.api.transcribe_speech``) for the caller's track, off the
call's audio path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy.signal import resample_poly

from inference.contracts import ParleyError

POCKETSPHINX_RATE = 16_000
WHISPER_RATE = 16_000
FRAMES_PER_S = 100  # PocketSphinx's default frame rate (10 ms frames)
FILLERS = {"<s>", "</s>", "<sil>"}  # sentence marks and silence, not words
SILENCE_DBFS = -45.0  # audio with no 10 ms frame louder than this holds no speech (PocketSphinx "hears" a
# word or two in digital silence)


class TranscriptionError(ParleyError):
    """Audio that cannot be transcribed, or an engine that cannot be loaded (the reason says which)."""

    code = "transcription_failed"
    error_type = "server_error"


@dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds from the start of the audio given
    end: float


class Transcriber(Protocol):
    name: str

    def transcribe(self, pcm: np.ndarray, rate: int) -> list[Word]:
        """The words spoken in ``pcm`` (mono int16, or float in [-1, 1], at ``rate`` Hz), in time order."""
        ...


class PocketSphinxTranscriber:
    name = "pocketsphinx"

    def transcribe(self, pcm: np.ndarray, rate: int) -> list[Word]:
        from pocketsphinx import Decoder  # imported on use: only post-processing needs it

        audio = as_int16(pcm, rate, POCKETSPHINX_RATE)
        if not audio.size or loudest_frame_dbfs(audio, POCKETSPHINX_RATE) < SILENCE_DBFS:
            return []
        decoder = Decoder(loglevel="FATAL")
        decoder.start_utt()
        decoder.process_raw(audio.tobytes(), no_search=False, full_utt=True)
        decoder.end_utt()
        words = []
        for segment in decoder.seg():
            text = segment.word.split("(", 1)[0]  # "read(2)": the dictionary's second pronunciation
            if text in FILLERS or text.startswith("["):  # [NOISE], [BREATH]
                continue
            words.append(Word(text, segment.start_frame / FRAMES_PER_S, (segment.end_frame + 1) / FRAMES_PER_S))
        return words


class WhisperTranscriber:
    """faster-whisper with word timestamps. ``model_factory`` builds the model from the weights' path
    (``faster_whisper.WhisperModel`` unless a test passes its own)."""

    name = "whisper"

    def __init__(self, weights: str, *, model_factory: Callable[[str], Any] | None = None):
        self.weights = weights
        self._factory = model_factory
        self._model = None

    def transcribe(self, pcm: np.ndarray, rate: int) -> list[Word]:
        audio = as_int16(pcm, rate, WHISPER_RATE).astype(np.float32) / 32768.0
        if not audio.size:
            return []
        segments, _info = self._load().transcribe(audio, word_timestamps=True)
        return [
            Word(word.word.strip(), float(word.start), float(word.end))
            for segment in segments
            for word in segment.words or ()
            if word.word.strip()
        ]

    def _load(self):
        if self._model is None:
            factory = self._factory
            if factory is None:
                try:
                    from faster_whisper import WhisperModel
                except ImportError as exc:
                    raise TranscriptionError(
                        "PARLEY_WHISPER_WEIGHTS is set but faster-whisper is not installed"
                    ) from exc
                factory = WhisperModel
            try:
                self._model = factory(self.weights)
            except Exception as exc:  # noqa: BLE001 - any loader fault is the deployment's weights, named
                raise TranscriptionError(f"the Whisper weights could not be loaded: {type(exc).__name__}") from exc
        return self._model


def transcriber_for(engine: str, *, whisper_weights: str = "") -> Transcriber | None:
    """The configured engine: "pocketsphinx" (default), "whisper" (needs weights), "off" (None)."""
    if engine == "off":
        return None
    if engine == "whisper" or (engine == "auto" and whisper_weights):
        if not whisper_weights:
            raise TranscriptionError("the whisper transcriber needs PARLEY_WHISPER_WEIGHTS")
        return WhisperTranscriber(whisper_weights)
    if engine in ("pocketsphinx", "auto"):
        return PocketSphinxTranscriber()
    raise TranscriptionError(f"unknown transcriber {engine!r}: pocketsphinx, whisper, auto or off")


def loudest_frame_dbfs(audio: np.ndarray, rate: int) -> float:
    """The level of the loudest 10 ms frame of int16 ``audio``, in dBFS."""
    frame = max(1, rate // 100)
    n = max(1, len(audio) // frame)
    frames = np.zeros(n * frame, np.float64)
    frames[: min(len(audio), n * frame)] = audio[: n * frame] / 32768.0
    rms = np.sqrt(np.mean(frames.reshape(n, frame) ** 2, axis=1))
    return float(20 * np.log10(max(float(rms.max()), 1e-10)))


def as_int16(pcm: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """Mono int16 at ``target_rate``."""
    samples = np.asarray(pcm)
    if rate <= 0 or samples.ndim != 1:
        raise TranscriptionError("the audio to transcribe is not one channel at a positive rate")
    floats = samples.astype(np.float32) / (32768.0 if samples.dtype.kind in "iu" else 1.0)
    if rate != target_rate and floats.size:
        g = np.gcd(rate, target_rate)
        floats = resample_poly(floats, target_rate // g, rate // g)
    return np.clip(np.round(floats * 32767), -32768, 32767).astype(np.int16)
