"""``PARLEY_LOCKSTEP_CONTEXT``: the lockstep engine attending to fewer frames than its checkpoint's context.

The engine with a shorter context must be exactly the model of a checkpoint whose config says that context (whose
ring wrap is checked against the reference elsewhere), with its KV and its capabilities sized to it; a session whose
prompt does not fit that context is refused when it opens, and the slot stays usable.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from inference.config import ConfigError, InferenceConfig
from inference.engines.base import EngineError, SlotConfig, SlotInput, VoiceRef
from inference.engines.lockstep import LockstepEngine
from inference.models.moshi.make_checkpoint import make_checkpoint
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA
from tests.inference.models.moshi.test_lockstep_engine import speech_like

SHORT = 130  # frames; the tiny Moshiko's own context is 500
FRAMES = 160  # past the short ring's wrap


@pytest.fixture(scope="module")
def moshiko_dir(tmp_path_factory):
    return make_checkpoint("tiny-moshiko", tmp_path_factory.mktemp("ckpt") / "moshiko", 3)


def _talk(engine: LockstepEngine, audio: np.ndarray) -> tuple[list[str], np.ndarray]:
    """One slot fed ``FRAMES`` frames: the agent's text and audio of every frame."""
    engine.open_slot(0, SlotConfig())
    text, out_audio = [], []
    for i in range(FRAMES):
        out = engine.step({0: SlotInput(audio=audio[i * 1920 : (i + 1) * 1920])})[0]
        text.append(out.text)
        out_audio.append(out.audio)
    return text, np.concatenate(out_audio)


def test_a_shorter_context_is_the_model_of_a_checkpoint_with_that_context(moshiko_dir, tmp_path):
    shortened = tmp_path / "moshiko-short"
    shutil.copytree(moshiko_dir, shortened)
    config = json.loads((shortened / "config.json").read_text())
    assert config["context"] == 500
    config["context"] = SHORT
    (shortened / "config.json").write_text(json.dumps(config))

    audio = speech_like(4, FRAMES)
    engine = LockstepEngine.from_config(
        InferenceConfig(engine="moshi", checkpoint=moshiko_dir, slots=1, greedy=True, lockstep_context=SHORT)
    )
    engine.warmup()
    assert engine.backend.state.kv.window == SHORT  # the ring (and with it every page count) follows
    assert engine.capabilities.extra["context_s"] == pytest.approx(SHORT * 0.08)
    got = _talk(engine, audio)

    same = LockstepEngine(shortened, 1, greedy=True)
    same.warmup()
    want = _talk(same, audio)
    assert got[0] == want[0]
    assert np.array_equal(got[1], want[1])

    full = LockstepEngine(moshiko_dir, 1, greedy=True)  # the checkpoint's own 500 frames: not the same model
    full.warmup()
    assert full.capabilities.extra["context_s"] == pytest.approx(40.0)
    whole = _talk(full, audio)[1]
    wrapped = SHORT * 1920  # the two models hear the same frames until the short ring first drops one
    assert np.array_equal(whole[:wrapped], got[1][:wrapped]) and not np.array_equal(whole, got[1])


def test_a_context_longer_than_the_checkpoints_keeps_the_checkpoints(moshiko_dir):
    engine = LockstepEngine(moshiko_dir, 1, context=4000)
    assert engine.info.lm.context == 500 and engine.capabilities.extra["context_s"] == pytest.approx(40.0)


def test_a_prompt_longer_than_the_context_is_refused_and_the_slot_stays_usable():
    engine = LockstepEngine(PERSONAPLEX_DATA / "ckpt", 1, context=SHORT)
    engine.warmup()
    persona = (PERSONAPLEX_DATA / "persona.txt").read_text()
    voice = VoiceRef("pack", PERSONAPLEX_DATA / "voice_prompt.pt")
    with pytest.raises(EngineError, match=r"context is 10\.3 s \(PARLEY_LOCKSTEP_CONTEXT\)"):
        engine.open_slot(0, SlotConfig(persona=persona * 8, voice=voice))
    engine.open_slot(0, SlotConfig(persona=persona, voice=voice))  # fits: the refused one left nothing behind
    while engine.step({}).get(0).prefilling:
        pass
    out = engine.step({0: SlotInput(audio=np.zeros(1920, np.float32))})[0]
    assert out.audio.shape == (1920,)


def test_the_setting_is_read_and_bounded():
    assert InferenceConfig.from_env({}).lockstep_context == 0
    assert InferenceConfig.from_env({"PARLEY_LOCKSTEP_CONTEXT": "1500"}).lockstep_context == 1500
    with pytest.raises(ConfigError, match="PARLEY_LOCKSTEP_CONTEXT='100'"):
        InferenceConfig.from_env({"PARLEY_LOCKSTEP_CONTEXT": "100"})
