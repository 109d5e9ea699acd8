"""The unit engine speaks through the native Token2Wav whenever assets are configured, and refuses bad ones."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from inference.config import InferenceConfig
from inference.engines import build_engine
from inference.engines.base import EngineError, SlotConfig, SlotInput, VoiceRef
from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets


@pytest.fixture(scope="module")
def speaking_checkpoint(minicpmo_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint (linked) plus tiny random Token2Wav assets inside it."""
    out = tmp_path_factory.mktemp("ckpt-t2w")
    for item in minicpmo_checkpoint.iterdir():
        os.symlink(item, out / item.name)
    make_token2wav_assets(out / "assets" / "token2wav", seed=1234)
    return out


def test_engine_speaks_with_the_sessions_voice(speaking_checkpoint, minicpmo_data_dir):
    previous = torch.get_num_threads()
    eng = build_engine(InferenceConfig(engine="minicpmo", checkpoint=speaking_checkpoint, slots=1))
    eng.warmup()
    try:
        assert eng.capabilities.extra["vocoder"] == "token2wav"
        d = minicpmo_data_dir / "audio8"
        golden = json.loads((d / "golden.json").read_text())
        audio = np.load(d / "user_audio.npy")
        eng.open_slot(
            0, SlotConfig(persona=golden["options"]["system_prompt"], voice=VoiceRef("g", d / "ref_audio.npy"))
        )
        eng.step({})
        spoken = []
        for u in range(5):
            out = eng.step({0: SlotInput(audio=audio[u * 16000 : (u + 1) * 16000])})[0]
            assert out.decision == ("listen" if golden["units"][u]["is_listen"] else "speak")
            if out.decision == "speak":
                assert out.audio.shape == (24000,) and out.audio.dtype == np.float32
                spoken.append(out.audio)
        assert spoken, "the golden speaks from unit 3"
        rms = float(np.sqrt(np.mean(np.concatenate(spoken) ** 2)))
        assert rms > 0.01, f"played RMS {rms}: silence"
        eng.close_slot(0)
    finally:
        torch.set_num_threads(previous)


def test_engine_refuses_to_start_on_bad_assets(speaking_checkpoint, tmp_path):
    broken = tmp_path / "ckpt"
    broken.mkdir()
    for item in speaking_checkpoint.iterdir():
        if item.name != "assets":
            os.symlink(item.resolve(), broken / item.name)
    shutil.copytree(speaking_checkpoint / "assets", broken / "assets")
    (broken / "assets" / "token2wav" / "campplus.onnx").unlink()
    eng = build_engine(InferenceConfig(engine="minicpmo", checkpoint=broken, slots=1))
    with pytest.raises(EngineError, match="campplus.onnx"):
        eng.warmup()


def test_a_tick_speaks_each_slot_as_the_slot_ticked_alone(
    speaking_checkpoint, minicpmo_data_dir, tmp_path, monkeypatch
):
    """The speaking slots of a tick go through the vocoder together (their chunks batched); each slot's audio is
    what the same slot gets when ticked alone. Slots 0-2 tick together, slots 3-5 take the same units one by one.
    Three voices (the golden clip, the built-in one, a 3 s clip: a longer prompt, so never batched with the
    others), three inputs; slot 0's turn ends at unit 4 (the result is marked so: the tiny model never ends one
    here) and slot 1 is forced to listen mid-turn at unit 5: both start a new vocoder turn, as before batching."""
    from inference.engines.unit import UnitEngine
    from inference.models.minicpmo.token2wav.stream import Token2WavModel
    from inference.models.minicpmo.vocoder import SILENCE_CODE

    sizes: list[int] = []
    original = Token2WavModel._chunk_batch

    def spy(self, streams, token_lists, last):
        sizes.append(len(streams))
        return original(self, streams, token_lists, last)

    monkeypatch.setattr(Token2WavModel, "_chunk_batch", spy)
    d = minicpmo_data_dir
    speech = {name: np.load(d / name / "user_audio.npy").astype(np.float32) for name in ("audio8", "turnclose10")}
    long_clip = tmp_path / "long.npy"
    np.save(long_clip, 0.8 * np.tile(np.load(d / "audio8" / "ref_audio.npy"), 2)[:48000])
    voices = [VoiceRef("golden", d / "audio8" / "ref_audio.npy"), None, VoiceRef("long", long_clip)]
    previous = torch.get_num_threads()
    eng = UnitEngine(speaking_checkpoint, num_slots=6)
    eng.warmup()
    unit_index = 0
    generate_many = eng.runner.generate_many

    def turn_ends_at_unit_4(jobs):
        results = generate_many(jobs)
        ending = {id(eng.session_of(0)), id(eng.session_of(3))} if unit_index == 4 else set()
        return [
            dataclasses.replace(r, end_of_turn=True) if id(s) in ending and not r.is_listen else r
            for (s, _), r in zip(jobs, results, strict=True)
        ]

    monkeypatch.setattr(eng.runner, "generate_many", turn_ends_at_unit_4)

    def fresh_turn(slot: int) -> bool:
        state = eng._slots[slot].vocoder
        return state.buffer == [SILENCE_CODE] * 3 and state.caches[0].calls == 0

    try:
        for slot in range(6):
            eng.open_slot(slot, SlotConfig(voice=voices[slot % 3]))
        while any(out.prefilling for out in eng.step({}).values()):  # the prepares may take more than one tick
            pass
        batched, worst = [], 0.0
        for unit_index in range(7):
            u = unit_index
            units = {
                0: SlotInput(audio=speech["audio8"][u * 16000 : (u + 1) * 16000]),
                1: SlotInput(audio=speech["audio8"][u * 16000 + 8000 : (u + 1) * 16000 + 8000], force_listen=u == 5),
                2: SlotInput(audio=speech["turnclose10"][u * 16000 + 4000 : (u + 1) * 16000 + 4000]),
            }
            sizes.clear()
            together = eng.step(units)
            batched.append(list(sizes))
            for k, unit in units.items():
                alone = eng.step({k + 3: unit})[k + 3]
                got = together[k]
                assert (got.decision, got.text, got.end_of_turn) == (alone.decision, alone.text, alone.end_of_turn)
                assert got.audio.shape == alone.audio.shape, (u, k)
                if got.audio.size:
                    worst = max(worst, float(np.abs(got.audio - alone.audio).max()))
                # Batched vs alone moved the audio by at most 1.2e-4 over the 14 CPU code paths of
                # scripts/float-spread.sh; a slot given another's codes, stream or turn moves it by ~1.
                np.testing.assert_allclose(got.audio, alone.audio, rtol=0, atol=1e-3, err_msg=f"unit {u} slot {k}")
            if u == 4:
                assert together[0].end_of_turn and together[0].audio.shape[0] > 24000  # the turn's tail flushed
                assert fresh_turn(0) and fresh_turn(3)
            if u == 5:
                assert together[1].decision == "listen" and fresh_turn(1) and fresh_turn(4)
        print("batched tick vs slot alone, max abs diff:", worst, "batches per tick:", batched)
        # Speaking from unit 3: slots 0 1 (same prompt length) batched, slot 2 apart; slot 0 restarts at unit 5.
        assert batched == [[], [], [], [2, 1], [2, 1, 1], [1, 1], [1, 1, 1]], batched
    finally:
        for slot in range(6):
            eng.close_slot(slot)
        torch.set_num_threads(previous)


def test_device_memory_left_for_the_vocoder_limits_admission(
    speaking_checkpoint, minicpmo_data_dir, tmp_path, monkeypatch
):
    """With Token2Wav on a GPU the engine admits what the device memory left takes: a session's vocoder counted at
    its longest from the moment its slot opens, so the count does not rise as its caches grow and trim while it
    speaks; a voice with a longer prompt takes more. The device here is simulated: a total less what the live
    sessions' vocoders hold."""
    from inference.engines import unit

    previous = torch.get_num_threads()
    eng = unit.UnitEngine(speaking_checkpoint, num_slots=3)
    eng.warmup()
    try:
        assert eng.admissible_sessions() is None  # on the CPU memory does not limit admission
        eng.watch_vocoder_memory()
        per = eng._vocoder_session_bytes
        total = (unit.VOCODER_BATCH_HEADROOM + 3) * per + per // 2
        held = lambda: sum(eng.vocoder.state_bytes(s.vocoder)[0] for s in eng._slots.values())  # noqa: E731
        monkeypatch.setattr(unit, "device_spare_bytes", lambda device: total - held())
        assert eng.admissible_sessions() == 3
        eng.open_slot(0, SlotConfig())
        assert eng.admissible_sessions() == 2  # before its vocoder exists
        eng.step({})  # the prepare tick: the prompt's caches
        speech = np.load(minicpmo_data_dir / "audio8" / "user_audio.npy").astype(np.float32)
        seen = []
        for u in range(8):
            assert eng.admissible_sessions() == 2, u
            out = eng.step({0: SlotInput(audio=speech[u * 16000 : (u + 1) * 16000])})[0]
            now, longest = eng.vocoder.state_bytes(eng._slots[0].vocoder)
            assert now <= longest and longest == per, u  # the built-in voice, and never past its longest
            seen.append((out.decision, now))
        assert any(decision == "speak" for decision, _ in seen)
        assert max(now for _, now in seen) == per  # the turn's caches grew to their longest, and no further
        long_clip = tmp_path / "long.npy"  # 4 s: a longer prompt than the built-in voice's 2 s
        np.save(long_clip, np.tile(np.load(minicpmo_data_dir / "audio8" / "ref_audio.npy"), 3)[:64000])
        eng.open_slot(1, SlotConfig(voice=VoiceRef("long", long_clip)))
        eng.step({})
        _, longest = eng.vocoder.state_bytes(eng._slots[1].vocoder)
        assert longest > per
        assert eng.admissible_sessions() == (total - per - longest - unit.VOCODER_BATCH_HEADROOM * per) // per
    finally:
        torch.set_num_threads(previous)
