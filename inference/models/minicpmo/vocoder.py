"""Audio out: TTS codes -> 24 kHz audio.

``Token2WavVocoder`` wraps the Token2Wav (flow + HiFT) model of the PyPI package ``minicpmo-utils``
(module ``stepaudio2``). It needs the checkpoint's ``assets/token2wav`` directory and a GPU; its streaming
caches are per session (``VocoderState``) and swapped into the shared model around each call, so several
sessions share one vocoder. ``SilentVocoder`` is the fallback (tiny checkpoints, CPU): silence of the length
the codes stand for (25 codes per second), so everything downstream still runs.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

OUTPUT_RATE = 24000
CODES_PER_SECOND = 25
CHUNK_CODES = 25
SILENCE_CODE = 4218  # the reference primes each turn with three silence codes
ASSET_SUBDIR = Path("assets") / "token2wav"


@dataclass
class VocoderState:
    """One session's vocoder state: the pending code buffer and the model's streaming caches."""

    prompt_wav: str | None = None
    buffer: list[int] = field(default_factory=list)
    caches: tuple | None = None  # (flow stream cache, hift cache) of the current turn
    base_caches: tuple | None = None  # caches right after the voice prompt: a new turn starts from here


class SilentVocoder:
    """No vocoder: silence of the right length."""

    name = "none"

    def new_state(self, tts_ref_audio: np.ndarray | None) -> VocoderState:
        return VocoderState()

    def synthesize(self, state: VocoderState, codes: list[int], *, end_of_turn: bool) -> np.ndarray:
        return np.zeros(len(codes) * OUTPUT_RATE // CODES_PER_SECOND, dtype=np.float32)

    def new_turn(self, state: VocoderState) -> None:
        """Nothing to reset."""


class Token2WavVocoder:
    """Streaming Token2Wav from ``stepaudio2`` (GPU only). Untested here: no GPU or assets in CI."""

    name = "token2wav"

    def __init__(self, asset_dir: Path, *, float16: bool = True):
        from stepaudio2 import Token2wav  # optional dependency: minicpmo-utils

        self.model = Token2wav(str(asset_dir), float16=float16, n_timesteps=5)
        self.lookahead = int(self.model.flow.pre_lookahead_len)
        self._tmp = tempfile.TemporaryDirectory(prefix="parley-voice-")

    def new_state(self, tts_ref_audio: np.ndarray | None) -> VocoderState:
        """Prime the voice prompt caches for a session (``set_stream_cache`` reads a wav path)."""
        import soundfile

        state = VocoderState()
        if tts_ref_audio is None:
            return state
        path = Path(self._tmp.name) / f"voice-{id(state)}.wav"
        soundfile.write(path, np.asarray(tts_ref_audio, dtype=np.float32), 16000)
        state.prompt_wav = str(path)
        self.model.cache = None
        flow_cache, hift_cache = self.model.set_stream_cache(state.prompt_wav)
        state.base_caches = (copy.deepcopy(flow_cache), copy.deepcopy(hift_cache))
        self.new_turn(state)
        return state

    def new_turn(self, state: VocoderState) -> None:
        """Start a turn from the voice prompt caches."""
        if state.base_caches is not None:
            state.caches = copy.deepcopy(state.base_caches)
        state.buffer = [SILENCE_CODE] * 3

    def synthesize(self, state: VocoderState, codes: list[int], *, end_of_turn: bool) -> np.ndarray:
        """Stream the codes through flow + HiFT, flushing the unit (the reference's force_flush)."""
        if state.prompt_wav is None:
            return SilentVocoder().synthesize(state, codes, end_of_turn=end_of_turn)
        self.model.stream_cache, self.model.hift_cache_dict = state.caches
        state.buffer += codes
        pcm: list[bytes] = []
        while len(state.buffer) >= self.lookahead + 5:
            take = min(CHUNK_CODES + self.lookahead, len(state.buffer))
            pcm.append(self.model.stream(state.buffer[:take], prompt_wav=state.prompt_wav))
            state.buffer = state.buffer[min(CHUNK_CODES, take - self.lookahead) :]
        if end_of_turn and state.buffer:
            pcm.append(self.model.stream(state.buffer, prompt_wav=state.prompt_wav, last_chunk=True))
            state.buffer = []
        state.caches = (self.model.stream_cache, self.model.hift_cache_dict)
        audio = np.frombuffer(b"".join(pcm), dtype="<i2").astype(np.float32) / 32768.0
        want = len(codes) * OUTPUT_RATE // CODES_PER_SECOND
        if not end_of_turn and audio.shape[0] < want:
            audio = np.pad(audio, (want - audio.shape[0], 0))
        if end_of_turn:
            self.new_turn(state)
        return audio


def vocoder_kind(checkpoint_dir: Path, device: str) -> str:
    """The vocoder ``build_vocoder`` will pick, decided without loading anything."""
    import importlib.util

    asset_dir = Path(checkpoint_dir) / ASSET_SUBDIR
    if asset_dir.is_dir() and device.startswith("cuda") and importlib.util.find_spec("stepaudio2") is not None:
        return Token2WavVocoder.name
    return SilentVocoder.name


def build_vocoder(checkpoint_dir: Path, device: str) -> SilentVocoder | Token2WavVocoder:
    """Token2Wav when the assets, the package and a GPU are all present; silence otherwise."""
    asset_dir = Path(checkpoint_dir) / ASSET_SUBDIR
    if not asset_dir.is_dir() or not device.startswith("cuda"):
        return SilentVocoder()
    try:
        return Token2WavVocoder(asset_dir)
    except ImportError:
        logger.warning("vocoder.unavailable: %s exists but minicpmo-utils (stepaudio2) is not installed", asset_dir)
        return SilentVocoder()
