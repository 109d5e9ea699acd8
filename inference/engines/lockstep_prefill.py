"""What a lockstep slot feeds before it goes live: the voice prompt and the persona (PersonaPlex).

A ``.wav`` voice is Mimi-encoded one frame per pass, ahead of the pass that feeds it; a ``.safetensors`` codes
prompt (stored by the webapp) or a ``.pt`` / ``.safetensors`` prompt of the reference's layout is ready-made.
Moshiko has no system prompt and goes live at its first tick.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from inference.engines.base import EngineError, SlotConfig
from inference.engines.lockstep_backends import LockstepBackend
from inference.engines.lockstep_checkpoint import SAMPLE_RATE
from inference.models.moshi.codes_prompt import read_codes_prompt
from inference.models.moshi.config import LMConfig
from inference.models.moshi.personaplex import (
    DEFAULT_PERSONA,
    FRAME_SAMPLES,
    MAX_VOICE_FRAMES,
    PrefillFrame,
    VoicePromptError,
    build_prefill,
    iter_voice_frames_from_pcm,
    load_voice_prompt,
    persona_tokens,
    voice_frames_from_codes,
    voice_frames_from_prompt,
    voice_pass_count,
)


def slot_prefill(
    lm_config: LMConfig, tokenizer, backend: LockstepBackend, config: SlotConfig
) -> tuple[Iterator[PrefillFrame] | None, int]:
    """The prefill frames of a session with ``config`` and how many there are (None, 0 for Moshiko).

    Raises:
        EngineError: an unreadable or too long voice prompt, an empty persona, persona ids past the vocabulary.
    """
    if not lm_config.personaplex:
        return None, 0  # Moshiko has no system prompt: live from the first tick
    voice_frames: list[PrefillFrame] = []  # a .pt / .safetensors prompt: ready-made, part of build_prefill
    streamed: Iterator[PrefillFrame] = iter(())  # a .wav prompt: Mimi-encoded one frame per pass, ahead of it
    streamed_count = 0
    path = config.voice.path if config.voice is not None else None
    try:
        if path is not None and Path(path).suffix.lower() == ".wav":
            from inference.models.moshi.audio_prep import load_voice_wav

            pcm = load_voice_wav(path)
            if len(pcm) > MAX_VOICE_FRAMES * FRAME_SAMPLES:
                raise VoicePromptError(
                    f"{path}: voice prompt longer than {MAX_VOICE_FRAMES * FRAME_SAMPLES // SAMPLE_RATE} s"
                )
            streamed_count = voice_pass_count(len(pcm))
            streamed = iter_voice_frames_from_pcm(backend.codec, pcm, lm_config)
        elif path is not None and (codes := _codes_prompt(path)) is not None:  # Mimi codes stored by the webapp
            if codes.shape[-1] > MAX_VOICE_FRAMES:
                raise VoicePromptError(
                    f"{path}: voice prompt longer than {MAX_VOICE_FRAMES * FRAME_SAMPLES // SAMPLE_RATE} s"
                )
            voice_frames = voice_frames_from_codes(lm_config, codes)
        elif path is not None:
            prompt = load_voice_prompt(path, lm_config, backend.ct)
            voice_frames = voice_frames_from_prompt(lm_config, prompt)
        ids = persona_tokens(tokenizer, config.persona or DEFAULT_PERSONA)
    except ValueError as exc:  # VoicePromptError, AudioPrepError, LoudnessError, empty persona
        raise EngineError(f"cannot prepare the session: {exc}") from exc
    if any(not 0 <= i < lm_config.text_card for i in ids):
        # a tokenizer larger than the model's text vocabulary; inside a CUDA graph this would kill the context
        raise EngineError(f"persona token ids must be below the model's text_card {lm_config.text_card}")
    rest = build_prefill(lm_config, voice=voice_frames, persona_ids=ids).frames
    return itertools.chain(streamed, rest), streamed_count + len(rest)


def _codes_prompt(path) -> np.ndarray | None:
    """The Mimi codes of a ``.safetensors`` codes prompt (``inference.models.moshi.codes_prompt``), None for other
    prompts."""
    if Path(path).suffix.lower() != ".safetensors":
        return None
    return read_codes_prompt(path)
