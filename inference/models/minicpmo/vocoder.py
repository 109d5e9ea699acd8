"""Audio out: TTS codes -> 24 kHz audio.

``Token2WavVocoder`` runs the native Token2Wav (``token2wav/``: flow + HiFT, matched to the reference) on the
engine's device whenever assets are configured (``PARLEY_VOCODER_DIR`` or the checkpoint's
``assets/token2wav``); its streams are per session (``VocoderState``). Bad assets raise at load, so the engine
refuses to start rather than speak silence. ``SilentVocoder`` is used only where no assets are configured:
silence of the length the codes stand for (25 codes per second).
"""

from __future__ import annotations

import hashlib
import logging
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from inference.models.minicpmo.token2wav.stream import Token2WavStream

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
    caches: tuple | None = None  # (Token2WavStream,) of the current turn
    base_caches: tuple | None = None  # (Token2WavStream,) right after the voice prompt: a new turn starts here


class SilentVocoder:
    """No vocoder: silence of the right length."""

    name = "none"

    def new_state(self, tts_ref_audio: np.ndarray | None) -> VocoderState:
        return VocoderState()

    def synthesize(self, state: VocoderState, codes: list[int], *, end_of_turn: bool) -> np.ndarray:
        return np.zeros(len(codes) * OUTPUT_RATE // CODES_PER_SECOND, dtype=np.float32)

    def synthesize_many(
        self, states: list[VocoderState], code_lists: list[list[int]], end_of_turns: list[bool]
    ) -> list[np.ndarray]:
        return [self.synthesize(s, c, end_of_turn=e) for s, c, e in zip(states, code_lists, end_of_turns, strict=True)]

    def new_turn(self, state: VocoderState) -> None:
        """Nothing to reset."""


class Token2WavVocoder:
    """The native Token2Wav (``token2wav/``) on the engine's device: one loaded model, a stream per session.

    A session's voice clip is the prompt (the built-in prompt when it has none); each turn restarts from the
    caches right after the prompt, primed with three silence codes; every unit's codes go out at once as
    chunks of 25 + 3 look-ahead, and the end of a turn flushes the rest.

    Sessions with the same voice share the prompt's primed stream (``_primed``): a turn only ever forks it, so one
    copy serves them all, and a new session with a voice already in use skips the prompt's encoding (the S3
    tokenizer and the speaker embedding on the host, the flow over the prompt on the device), which otherwise
    runs in the tick that prepares it.
    """

    name = "token2wav"

    def __init__(self, asset_dir: Path, device: str = "cpu", n_timesteps: int = 5):
        from inference.models.minicpmo.token2wav.prompt import PromptEncoder
        from inference.models.minicpmo.token2wav.stream import Token2WavModel

        self.model = Token2WavModel.load(asset_dir, device=device, n_timesteps=n_timesteps)
        self.prompts = PromptEncoder(asset_dir)
        self.lookahead = self.model.lookahead
        # voice clip digest -> its primed stream, kept while a session holds it: a voice nobody speaks with any
        # more gives its device memory back (a 30 s clip's caches hold its 1 500 frames, over a gigabyte at the
        # published sizes)
        self._primed: weakref.WeakValueDictionary[bytes, Token2WavStream] = weakref.WeakValueDictionary()
        self._builtin: Token2WavStream | None = None  # the built-in voice's, kept for good (2 s, the common case)

    def new_state(self, tts_ref_audio: np.ndarray | None) -> VocoderState:
        """A session's state: its turn forked from its voice's primed stream (the prompt is encoded and the stream
        primed only when no live session holds the voice)."""
        clip = builtin_prompt() if tts_ref_audio is None else np.asarray(tts_ref_audio, dtype=np.float32)
        if clip.shape[0] < 4000:  # the S3 tokenizer needs a few frames; pad a very short clip with silence
            clip = np.pad(clip, (0, 4000 - clip.shape[0]))
        clip = np.ascontiguousarray(clip[: 30 * 16000], dtype=np.float32)
        key = hashlib.blake2b(clip.tobytes(), digest_size=16).digest()
        primed = self._primed.get(key)
        if primed is None:
            primed = self.model.start(self.prompts.encode(clip))
            self._primed[key] = primed
            if tts_ref_audio is None:
                self._builtin = primed
        state = VocoderState()
        state.base_caches = (primed,)
        self.new_turn(state)
        return state

    def state_bytes(self, state: VocoderState) -> tuple[int, int]:
        """(device bytes the session's vocoder holds now, the most it will hold): its prompt's caches beside its
        turn's, as they are and at their longest."""
        if state.base_caches is None:
            return 0, 0
        base = state.base_caches[0]
        now = base.nbytes() + (state.caches[0].nbytes() if state.caches is not None else 0)
        return now, base.nbytes() + self.model.longest_nbytes(base)

    def new_turn(self, state: VocoderState) -> None:
        """Start a turn from the prompt's caches."""
        if state.base_caches is not None:
            state.caches = (state.base_caches[0].fork(),)
        state.buffer = [SILENCE_CODE] * 3

    def synthesize(self, state: VocoderState, codes: list[int], *, end_of_turn: bool) -> np.ndarray:
        """Stream the unit's codes; pad to the unit's length while the turn goes on."""
        return self.synthesize_many([state], [codes], [end_of_turn])[0]

    def synthesize_many(
        self, states: list[VocoderState], code_lists: list[list[int]], end_of_turns: list[bool]
    ) -> list[np.ndarray]:
        """``synthesize`` for several sessions' units at once, their chunks batched round by round.

        A unit takes 0, 1 or 2 chunks of a session (then its last one at the end of a turn); each round takes the
        next chunk of every session that has one, and the model batches those that line up.
        """
        if len({id(s) for s in states}) != len(states):
            raise ValueError("a session can take only one unit per call")
        assert all(state.caches is not None for state in states)
        for state, codes in zip(states, code_lists, strict=True):
            state.buffer += [int(c) for c in codes]
        pieces: list[list[np.ndarray]] = [[] for _ in states]
        while True:
            chunks = [(i, c) for i, s in enumerate(states) if (c := self._next_chunk(s, end_of_turns[i])) is not None]
            if not chunks:
                break
            outs = self.model.chunk_many(
                [states[i].caches[0] for i, _ in chunks], [c[0] for _, c in chunks], [c[1] for _, c in chunks]
            )
            for (i, _), (audio, _) in zip(chunks, outs, strict=True):
                pieces[i].append(audio)
        return [
            self._unit_audio(*args) for args in zip(states, pieces, map(len, code_lists), end_of_turns, strict=True)
        ]

    def _next_chunk(self, state: VocoderState, end_of_turn: bool) -> tuple[list[int], bool] | None:
        """Take the session's next chunk off its buffer: (tokens, last), or None when it has none to run.

        25 codes + 3 of look-ahead while the buffer holds at least 3 + 5; at the end of a turn, the rest as a last
        chunk. The look-ahead codes stay in the buffer: they begin the next chunk.
        """
        if len(state.buffer) >= self.lookahead + 5:
            take = min(CHUNK_CODES + self.lookahead, len(state.buffer))
            tokens = state.buffer[:take]
            state.buffer = state.buffer[min(CHUNK_CODES, take - self.lookahead) :]
            return tokens, False
        if end_of_turn and state.buffer:
            tokens, state.buffer = state.buffer, []
            return tokens, True
        return None

    def _unit_audio(self, state: VocoderState, pieces: list[np.ndarray], n_codes: int, end_of_turn: bool) -> np.ndarray:
        """The unit's audio from its chunks: padded (at the front) to the unit's length while the turn goes on; a
        turn's end starts the next turn."""
        audio = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
        want = n_codes * OUTPUT_RATE // CODES_PER_SECOND
        if not end_of_turn and audio.shape[0] < want:
            audio = np.pad(audio, (want - audio.shape[0], 0))
        if end_of_turn:
            self.new_turn(state)
        return audio


def builtin_prompt(seconds: float = 2.0) -> np.ndarray:
    """The prompt of a session without a voice: a 16 kHz gliding harmonic tone (no recorded voice ships)."""
    t = np.arange(int(seconds * 16000)) / 16000
    phase = 2 * np.pi * np.cumsum(120 + 40 * np.sin(2 * np.pi * 0.7 * t)) / 16000
    env = np.minimum(1, np.minimum(t, t[-1] - t) * 8)
    return (0.3 * env * sum(np.sin(k * phase) / k for k in range(1, 6))).astype(np.float32)


def asset_dir_for(checkpoint_dir: Path) -> Path:
    """``PARLEY_VOCODER_DIR`` when set, else the checkpoint's ``assets/token2wav``."""
    configured = os.environ.get("PARLEY_VOCODER_DIR")
    return Path(configured) if configured else Path(checkpoint_dir) / ASSET_SUBDIR


def vocoder_kind(checkpoint_dir: Path, device: str) -> str:
    """The vocoder ``build_vocoder`` will pick, decided without loading anything."""
    return Token2WavVocoder.name if asset_dir_for(checkpoint_dir).exists() else SilentVocoder.name


def build_vocoder(checkpoint_dir: Path, device: str) -> SilentVocoder | Token2WavVocoder:
    """Token2Wav whenever assets are configured (bad assets raise ``AssetError``: no silent fallback); else silence."""
    asset_dir = asset_dir_for(checkpoint_dir)
    if not asset_dir.exists():
        return SilentVocoder()
    return Token2WavVocoder(asset_dir, device=device)
