"""Instant start: a session started from the prefill cache equals one that prefilled, token for token.

Real engine, real tiny PersonaPlex checkpoint (random weights, made here), greedy decoding; both steppers.
The tokens are the backend's own per-pass outputs (text + agent codebooks), read by wrapping its ``step``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference.engines.base import SlotConfig, SlotInput, VoiceRef
from inference.engines.lockstep import LockstepEngine
from inference.models.moshi.make_checkpoint import make_checkpoint

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # tests/conftest.py

VOICE_PT = Path(__file__).resolve().parents[1] / "data" / "personaplex" / "voice_prompt.pt"  # dim 64: tiny presets
LIVE_FRAMES = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("tiny-personaplex", tmp_path_factory.mktemp("ckpt") / "ckpt", 0)


def speech_like(frames: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    t = np.arange(frames * 1920) / 24000
    tone = 0.2 * np.sin(2 * np.pi * (160 + 50 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (tone + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


class TokenLog:
    """Wraps the backend's step: every pass's host tokens for ``slot`` are kept (the call itself is unchanged)."""

    def __init__(self, engine: LockstepEngine, slot: int):
        self.tokens: list[list[int]] = []
        backend, real_step = engine.backend, engine.backend.step

        def step(rows, pcm=None, frozen=()):
            result = real_step(rows, pcm, frozen)
            if slot in rows.slots[: rows.num_live]:
                self.tokens.append(result.tokens[rows.slots.index(slot)].tolist())
            return result

        backend.step = step


def run_session(engine: LockstepEngine, config: SlotConfig, audio: np.ndarray) -> dict:
    """Open slot 0, tick until it is live, feed LIVE_FRAMES frames; the agent's tokens, PCM and text."""
    log = TokenLog(engine, 0)
    engine.open_slot(0, config)
    live_at_open = engine.live_at_open(0)
    prefill_ticks = 0
    while engine._slots[0].live is False:
        out = engine.step({})
        prefill_ticks += 1
        assert out[0].prefilling or not engine._slots[0].live or out[0].progress == 1.0
    pcm, text = [], []
    for frame in range(LIVE_FRAMES):
        out = engine.step({0: SlotInput(audio=audio[frame * 1920 : (frame + 1) * 1920])})
        pcm.append(out[0].audio)
        text.append(out[0].text)
    engine.close_slot(0)
    engine.backend.step = type(engine.backend).step.__get__(engine.backend)  # unwrap
    return {
        "tokens": log.tokens,
        "pcm": np.concatenate(pcm),
        "text": text,
        "prefill_ticks": prefill_ticks,
        "live_at_open": live_at_open,
    }


@pytest.mark.parametrize("backend", ["eager", "fast"])
def test_cached_start_equals_prefilled_start_token_for_token(checkpoint, backend):
    engine = LockstepEngine(checkpoint, 2, greedy=True, backend=backend)
    engine.warmup()
    audio = speech_like(LIVE_FRAMES)
    config = SlotConfig(persona="You are a patient museum guide.", voice=VoiceRef("v", VOICE_PT))

    prefilled = run_session(engine, config, audio)
    assert prefilled["prefill_ticks"] > 1 and len(engine.prefill_cache) == 1
    cached = run_session(engine, config, audio)

    assert cached["prefill_ticks"] == 0, "a cached start is live before its first tick"
    assert cached["live_at_open"] and not prefilled["live_at_open"]  # so the worker feeds it from that tick
    assert engine.prefill_cache.hits == 1
    assert len(cached["tokens"]) == len(prefilled["tokens"]) == LIVE_FRAMES
    assert cached["tokens"] == prefilled["tokens"]
    np.testing.assert_array_equal(cached["pcm"], prefilled["pcm"])
    assert cached["text"] == prefilled["text"]

    # the reference: a fresh engine with the cache off gives the same tokens too
    plain = LockstepEngine(checkpoint, 2, greedy=True, backend=backend, prefill_cache_entries=0)
    plain.warmup()
    assert run_session(plain, config, audio)["tokens"] == prefilled["tokens"]
    assert len(plain.prefill_cache) == 0


def test_a_different_persona_or_voice_is_a_different_start(checkpoint, tmp_path):
    engine = LockstepEngine(checkpoint, 1, greedy=True, prefill_cache_entries=2)
    engine.warmup()
    audio = speech_like(LIVE_FRAMES)
    run_session(engine, SlotConfig(persona="You are a pirate."), audio)
    other = run_session(engine, SlotConfig(persona="You are a poet."), audio)
    assert other["prefill_ticks"] > 0 and engine.prefill_cache.hits == 0
    voiced = run_session(engine, SlotConfig(persona="You are a pirate.", voice=VoiceRef("v", VOICE_PT)), audio)
    assert voiced["prefill_ticks"] > 0
    assert len(engine.prefill_cache) == 2  # bounded: the oldest start was dropped
    again = run_session(engine, SlotConfig(persona="You are a pirate."), audio)
    assert again["prefill_ticks"] > 0, "evicted by the LRU bound"
