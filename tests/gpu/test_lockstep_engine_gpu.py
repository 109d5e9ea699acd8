"""LockstepEngine on CUDA: the fast backend (CUDA graphs per bucket, Triton kernels, graphed Mimi) against the
eager backend on the same GPU, float32, golden PersonaPlex checkpoint, 2 slots, 40 ticks.

Self-contained (no tests/conftest.py, no Django): run it as ``cd tests/gpu && python3 -m pytest -q --confcutdir .``.
Script: slot 0 opens at tick 0 (``.pt`` voice prompt + the pack's persona), slot 1 at tick 3 (``.safetensors``
voice prompt, its first prefill frame riding along slot 0's live pass), slot 0 paused for ticks 15-17. The prefill
budget is unbounded, so each prefill ends within its opening tick on both backends whatever the timing.
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
from inference.engines.lockstep_fast_backend import FastBackend  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "personaplex"
TICKS = 40
JOIN_TICK = 3
PAUSED = range(15, 18)


def speech_like(seed: int, frames: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / 24000
    tone = 0.2 * np.sin(2 * np.pi * (170 + 45 * np.sin(2 * np.pi * 0.6 * t)) * t)
    return (tone + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def run(backend: str):
    engine = LockstepEngine(
        DATA / "ckpt", 2, device="cuda", dtype="float32", greedy=True, prefill_budget_ms=1e9, backend=backend
    )
    engine.warmup()
    passes = []
    step = engine.backend.step

    def recording(rows, pcm=None, frozen=()):
        result = step(rows, pcm, frozen)
        passes.append((list(rows.slots), result.tokens.tolist(), result.valid.tolist()))
        return result

    engine.backend.step = recording
    audio = {s: speech_like(20 + s, TICKS) for s in (0, 1)}
    fed = {0: 0, 1: 0}
    persona = (DATA / "persona.txt").read_text()
    engine.open_slot(0, SlotConfig(persona=persona, voice=VoiceRef("pt", DATA / "voice_prompt.pt")))
    ticks = []
    for tick in range(TICKS):
        if tick == JOIN_TICK:
            voice = VoiceRef("st", DATA / "voice_prompt.safetensors")
            engine.open_slot(1, SlotConfig(persona="You enjoy talking about trains.", voice=voice))
        inputs = {}
        for s in (0, 1):
            st = engine._slots.get(s)
            if st is None or not st.live or (s == 0 and tick in PAUSED):
                continue
            inputs[s] = SlotInput(audio=audio[s][fed[s] * 1920 : (fed[s] + 1) * 1920])
            fed[s] += 1
        out = engine.step(inputs)
        ticks.append({s: (o.text, o.prefilling, o.audio.copy()) for s, o in out.items()})
    states = [engine.backend.slot_state(s) for s in (0, 1)]
    return engine, ticks, passes, fed, states


def test_fast_backend_on_cuda_equals_eager_backend_on_the_same_gpu():
    fast_engine, fast_ticks, fast_passes, fast_fed, fast_states = run("fast")
    backend = fast_engine.backend
    assert isinstance(backend, FastBackend)
    assert set(backend.graphed.graphs) == {1, 2}, "both batch buckets are captured at warm-up"
    assert backend.mimi_graphed, "Mimi encode and decode are captured at warm-up"
    assert not backend.lockstep.kv.fp8  # float32: exact rings (fp8 is the bf16 serving default)
    eager_engine, eager_ticks, eager_passes, eager_fed, eager_states = run("eager")
    assert eager_engine.backend.name == "eager"

    assert fast_fed == eager_fed and fast_fed[0] == TICKS - 1 - len(PAUSED) and fast_fed[1] > 20
    assert any(len(slots) == 2 for slots, _, _ in fast_passes), "a live row and a prefill row shared a pass"
    assert len(fast_passes) == len(eager_passes)
    for i, (a, b) in enumerate(zip(eager_passes, fast_passes, strict=True)):
        assert a == b, f"pass {i} over slots {a[0]}: eager {a[1]} vs fast {b[1]}"
    for (c0, p0, n0), (c1, p1, n1) in zip(eager_states, fast_states, strict=True):
        assert torch.equal(c0, c1) and torch.equal(p0, p1) and n0 == n1
    worst = 0.0
    for i, (a, b) in enumerate(zip(eager_ticks, fast_ticks, strict=True)):
        assert a.keys() == b.keys(), f"tick {i}"
        for s in a:
            assert a[s][:2] == b[s][:2], f"tick {i} slot {s}: text/prefilling differ"
            if a[s][2].size:
                worst = max(worst, float(np.abs(a[s][2] - b[s][2]).max()))
    assert worst < 1e-4, f"graphed Mimi PCM differs from eager Mimi by {worst}"
    text = "".join(t[0][0] for t in fast_ticks if 0 in t)
    assert text, "slot 0 produced text"
