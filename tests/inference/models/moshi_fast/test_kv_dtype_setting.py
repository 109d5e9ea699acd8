"""PARLEY_KV_DTYPE reaches the fast path's KV rings through the service configuration (tiny checkpoint, CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inference.config import ConfigError, InferenceConfig
from inference.engines.base import SlotConfig, SlotInput
from inference.engines.lockstep import LockstepEngine

pytest.importorskip("sentencepiece", reason="the lockstep engine needs sentencepiece for its tokenizer")

CKPT = Path(__file__).resolve().parents[3] / "data" / "personaplex" / "ckpt"


def engine_for(kv_dtype: str | None) -> LockstepEngine:
    env = {"PARLEY_ENGINE": "personaplex", "PARLEY_CHECKPOINT": str(CKPT), "PARLEY_SLOTS": "1"}
    if kv_dtype is not None:
        env["PARLEY_KV_DTYPE"] = kv_dtype
    engine = LockstepEngine.from_config(InferenceConfig.from_env(env))
    engine.warmup()
    return engine


@pytest.mark.parametrize(("kv_dtype", "fp8"), [("fp8", True), ("bf16", False), (None, False)])
def test_the_setting_picks_the_ring_format(kv_dtype, fp8):
    engine = engine_for(kv_dtype)
    kv = engine.backend.lockstep.kv
    assert kv.fp8 is fp8
    # float32 on CPU: 'bf16' and the default keep the model's own dtype; fp8 rings carry per-vector scales
    assert kv.keys[0].dtype == (torch.float8_e4m3fn if fp8 else torch.float32)
    engine.open_slot(0, SlotConfig())
    for _ in range(200):  # prefill, then live frames through the chosen rings
        out = engine.step({0: SlotInput(audio=np.zeros(1920, dtype=np.float32))} if engine._slots[0].live else {})
        if engine._slots[0].live and out[0].audio.size:
            break
    assert engine._slots[0].live and out[0].audio.shape == (1920,)
    assert np.isfinite(out[0].audio).all()


def test_an_unknown_format_is_refused_at_configuration():
    with pytest.raises(ConfigError, match="PARLEY_KV_DTYPE"):
        InferenceConfig.from_env({"PARLEY_KV_DTYPE": "int4"})
