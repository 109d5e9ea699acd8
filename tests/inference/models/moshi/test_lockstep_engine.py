"""The lockstep engine on tiny checkpoints: real Mimi, real LM, slots joining while others talk."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sentencepiece as spm
import torch

from inference.config import InferenceConfig
from inference.engines.base import EngineError, SlotConfig, SlotInput, VoiceRef
from inference.engines.lockstep import LockstepEngine
from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.make_checkpoint import make_checkpoint
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.mimi_loading import load_mimi
from inference.models.moshi.personaplex import DEFAULT_PERSONA, persona_tokens
from inference.models.moshi.replay import replay
from inference.models.moshi.text import TextDetokenizer
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA

GOLDEN = json.loads((PERSONAPLEX_DATA / "golden.json").read_text())


@pytest.fixture(scope="module")
def moshiko_dir(tmp_path_factory):
    return make_checkpoint("tiny-moshiko", tmp_path_factory.mktemp("ckpt") / "moshiko", 2)


def speech_like(seed: int, frames: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / 24000
    tone = 0.2 * np.sin(2 * np.pi * (180 + 40 * np.sin(2 * np.pi * 0.7 * t)) * t)
    return (tone + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def test_from_config_capabilities_and_demo_notice(moshiko_dir):
    engine = LockstepEngine.from_config(InferenceConfig(engine="moshi", checkpoint=moshiko_dir, slots=2))
    caps = engine.capabilities
    assert (caps.engine, caps.family, caps.chunk_period_ms) == ("moshi", "lockstep", 80)
    assert (caps.input_rate, caps.input_chunk_samples, caps.output_rate) == (24000, 1920, 24000)
    assert caps.demo_weights and "PARLEY_CHECKPOINT" in caps.extra["demo_notice"]
    with pytest.raises(EngineError, match="PARLEY_CHECKPOINT"):
        LockstepEngine.from_config(InferenceConfig(engine="moshi", checkpoint=None))
    with pytest.raises(EngineError, match="does not exist"):
        LockstepEngine.from_config(InferenceConfig(engine="moshi", checkpoint=moshiko_dir / "nope"))


def test_moshi_engine_equals_offline_replay_and_slots_are_independent(moshiko_dir):
    """Slot 1 talks from tick 0; slot 0 joins at tick 7 and is paused for 3 ticks; each slot's text equals
    the offline replay of its own audio (Mimi-encoded the same way), which is parity-tested against moshi."""
    engine = LockstepEngine(moshiko_dir, 2, greedy=True)
    engine.warmup()
    audio = {0: speech_like(0, 40), 1: speech_like(1, 40)}
    frames = {0: 0, 1: 0}
    text = {0: [], 1: []}
    engine.open_slot(1, SlotConfig())
    for tick in range(60):
        if tick == 7:
            engine.open_slot(0, SlotConfig())
        inputs = {}
        for slot in (0, 1):
            opened = slot == 1 or tick >= 7
            paused = slot == 0 and 20 <= tick < 23
            if opened and not paused and frames[slot] < 40 and getattr(engine._slots[slot], "live", False):
                i = frames[slot]
                inputs[slot] = SlotInput(audio=audio[slot][i * 1920 : (i + 1) * 1920])
                frames[slot] += 1
        out = engine.step(inputs)
        for slot in inputs:
            assert out[slot].audio.shape == (1920,) and out[slot].audio.dtype == np.float32
            assert np.isfinite(out[slot].audio).all()
            text[slot].append(out[slot].text)
    assert frames == {0: 40, 1: 40}
    info = read_checkpoint_dir(moshiko_dir)
    codec = load_mimi(info.mimi_weights, MimiConfig.from_dict(info.mimi_config))
    detok = TextDetokenizer(spm.SentencePieceProcessor(model_file=str(info.tokenizer)))
    for slot in (0, 1):
        codes = codec.encode(torch.from_numpy(audio[slot]).view(1, 1, -1))[0].numpy()
        expected = replay(info, codes, greedy=True)
        assert text[slot][0] == ""  # the first frame only primes the delays
        assert text[slot][1:] == [detok.piece(t) for t in expected[:, 0]], f"slot {slot}"
    assert "".join(text[0]) != "".join(text[1])


def test_bad_inputs_give_engine_errors(moshiko_dir):
    engine = LockstepEngine(moshiko_dir, 1)
    with pytest.raises(EngineError, match="before warmup"):
        engine.open_slot(0, SlotConfig())
    engine.warmup()
    engine.open_slot(0, SlotConfig())
    with pytest.raises(EngineError, match="already open"):
        engine.open_slot(0, SlotConfig())
    with pytest.raises(EngineError, match="out of range"):
        engine.open_slot(3, SlotConfig())
    engine.step({})  # prefill (none for Moshi) ends
    with pytest.raises(EngineError, match="expected 1920 samples"):
        engine.step({0: SlotInput(audio=np.zeros(100, np.float32))})
    noisy = np.full(1920, np.nan, np.float32)
    out = engine.step({0: SlotInput(audio=noisy)})
    assert np.isfinite(out[0].audio).all()
    engine.close_slot(0)
    with pytest.raises(EngineError, match="not open"):
        engine.step({0: SlotInput(audio=np.zeros(1920, np.float32))})


def test_personaplex_join_prefills_to_the_reference_state_while_another_slot_talks():
    """Golden ckpt: slot 0 talks; slot 1 joins with the pack's voice prompt and persona. After its prefill the
    slot's token ring and provided mask equal the reference's state after the prefill (golden.json)."""
    engine = LockstepEngine(PERSONAPLEX_DATA / "ckpt", 2, greedy=True, prefill_budget_ms=1e9)
    engine.warmup()
    persona = (PERSONAPLEX_DATA / "persona.txt").read_text()
    engine.open_slot(0, SlotConfig(persona="short"))
    ticks = 0
    while engine.step({}).get(0).prefilling:
        ticks += 1
    engine.open_slot(1, SlotConfig(persona=persona, voice=VoiceRef("pack", PERSONAPLEX_DATA / "voice_prompt.pt")))
    engine.prefill_budget_ms = 0.0  # one prefill frame per tick: it rides along the live step
    progress = []
    for tick in range(200):
        out = engine.step({0: SlotInput(audio=speech_like(tick, 1)[:1920])})
        assert out[0].audio.shape == (1920,)
        progress.append(out[1].progress)
        if not out[1].prefilling:
            break
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert len(progress) == GOLDEN["prefill"]["model_passes"] + 1
    gen = engine.gen
    assert int(gen.lengths[1]) + 1 == GOLDEN["prefill"]["offset_after"]
    assert gen.cache[1].tolist() == GOLDEN["prefill"]["token_cache_after"]
    assert gen.provided[1].int().tolist() == GOLDEN["prefill"]["provided_after"]


def test_personaplex_bad_voice_prompt_is_an_engine_error(tmp_path):
    engine = LockstepEngine(PERSONAPLEX_DATA / "ckpt", 1)
    engine.warmup()
    bad = tmp_path / "voice.pt"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(EngineError, match="voice prompt"):
        engine.open_slot(0, SlotConfig(voice=VoiceRef("bad", bad)))
    mp3 = tmp_path / "x.mp3"
    mp3.write_bytes(b"ID3")
    with pytest.raises(EngineError, match=r"must be \.pt, \.safetensors or \.wav"):
        engine.open_slot(0, SlotConfig(voice=VoiceRef("bad", mp3)))
    with pytest.raises(EngineError, match="persona text is empty"):
        engine.open_slot(0, SlotConfig(persona="   "))
    # a .wav prompt is encoded lazily, one frame per prefill pass: 28 frames -> 27 passes
    engine.open_slot(0, SlotConfig(voice=VoiceRef("wav", PERSONAPLEX_DATA / "voice_prompt.wav")))
    n_default = len(persona_tokens(engine.tokenizer, DEFAULT_PERSONA))
    assert engine._slots[0].prefill_total == 27 + 12 + n_default
    while engine.step({})[0].prefilling:
        pass
    # the pack's persona is the default one: the wav path reaches the reference's post-prefill state too
    assert int(engine.gen.lengths[0]) == 27 + 12 + n_default == GOLDEN["prefill"]["model_passes"]
    assert engine.gen.cache[0].tolist() == GOLDEN["prefill"]["token_cache_after"]
    assert engine.gen.provided[0].int().tolist() == GOLDEN["prefill"]["provided_after"]
