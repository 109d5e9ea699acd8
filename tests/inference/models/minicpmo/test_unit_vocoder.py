"""The unit engine speaks through the native Token2Wav whenever assets are configured, and refuses bad ones."""

from __future__ import annotations

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
