"""Instant start on CUDA: a session started from the prefill cache equals one that prefilled, token for token, on
the fast backend (CUDA graphs per bucket, graphed Mimi), float32, the golden PersonaPlex checkpoint, greedy.

Self-contained (no tests/conftest.py, no Django): run it as ``cd tests/gpu && python3 -m pytest -q --confcutdir .``.
The restore writes into the tensors the captured graphs read (in place), so this also checks that a graph replay
sees a restored slot exactly as it sees a prefilled one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

pytest.importorskip("sentencepiece", reason="the lockstep engine needs sentencepiece for its tokenizer")

from inference.engines.base import SlotConfig, SlotInput, VoiceRef  # noqa: E402
from inference.engines.lockstep import LockstepEngine  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "personaplex"
LIVE_FRAMES = 30


def run_session(engine: LockstepEngine, config: SlotConfig, audio: np.ndarray) -> tuple[list, int]:
    tokens: list[list[int]] = []
    real_step = engine.backend.step

    def step(rows, pcm=None, frozen=()):
        result = real_step(rows, pcm, frozen)
        if 0 in rows.slots[: rows.num_live]:
            tokens.append(result.tokens[rows.slots.index(0)].tolist())
        return result

    engine.backend.step = step
    engine.open_slot(0, config)
    prefill_ticks = 0
    while not engine._slots[0].live:
        engine.step({})
        prefill_ticks += 1
    for frame in range(LIVE_FRAMES):
        engine.step({0: SlotInput(audio=audio[frame * 1920 : (frame + 1) * 1920])})
    engine.close_slot(0)
    engine.backend.step = real_step
    return tokens, prefill_ticks


def test_cached_start_equals_prefilled_start_on_cuda_graphs():
    engine = LockstepEngine(DATA / "ckpt", 2, device="cuda", dtype="float32", greedy=True, backend="fast",
                            prefill_budget_ms=1e9)  # fmt: skip
    engine.warmup()
    rng = np.random.default_rng(3)
    audio = (0.1 * rng.standard_normal(LIVE_FRAMES * 1920)).astype(np.float32)
    persona = (DATA / "persona.txt").read_text()
    config = SlotConfig(persona=persona, voice=VoiceRef("v", DATA / "voice_prompt.pt"))
    prefilled, ticks = run_session(engine, config, audio)
    cached, cached_ticks = run_session(engine, config, audio)
    assert ticks >= 1 and cached_ticks == 0 and engine.prefill_cache.hits == 1
    assert len(prefilled) == LIVE_FRAMES and cached == prefilled
