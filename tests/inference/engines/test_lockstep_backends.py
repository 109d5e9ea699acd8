"""The fast backend (the GPU fast path's objects, torch twins on CPU) against the eager backend, through the engine.

Both engines run the same session script: two slots joining at different ticks (PersonaPlex: one with the pack's
``.pt`` voice prompt, one with its ``.wav``), one slot paused for three ticks while the other talks. Every LM pass
is recorded at the backend seam (slots, tokens, valid), and every tick's outputs at the engine seam; the two
backends must agree exactly on tokens and text, and on PCM.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inference.engines.base import EngineError, SlotConfig, SlotInput, VoiceRef
from inference.engines.lockstep import LockstepEngine
from inference.engines.lockstep_backends import EagerBackend, StepRows
from inference.engines.lockstep_fast_backend import FastBackend
from inference.models.moshi.make_checkpoint import make_checkpoint

DATA = Path(__file__).resolve().parents[2] / "data" / "personaplex"
PERSONA = (DATA / "persona.txt").read_text()
JOIN_TICK = 5
PAUSE = range(6, 9)  # live frames of slot 0 during which it is paused (slot 1 keeps talking)


@pytest.fixture(scope="module")
def moshiko_dir(tmp_path_factory):
    return make_checkpoint("tiny-moshiko", tmp_path_factory.mktemp("ckpt") / "moshiko", 3)


def speech_like(seed: int, frames: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / 24000
    tone = 0.2 * np.sin(2 * np.pi * (170 + 45 * np.sin(2 * np.pi * 0.6 * t)) * t)
    return (tone + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def record_passes(engine: LockstepEngine) -> list[tuple[list[int], list, list]]:
    """Wrap the engine's backend step so every pass's slots, tokens and valid flags are kept (nothing else changes)."""
    passes = []
    step = engine.backend.step

    def recording(rows: StepRows, pcm=None, frozen=()):
        result = step(rows, pcm, frozen)
        passes.append((list(rows.slots), result.tokens.tolist(), result.valid.tolist()))
        return result

    engine.backend.step = recording
    return passes


def run_script(engine: LockstepEngine, configs: dict[int, SlotConfig], live_frames: int, max_ticks: int = 400):
    """Slot 0 opens at tick 0, slot 1 at JOIN_TICK; each live slot gets its next frame every tick except slot 0
    during PAUSE (counted in its own live frames). Returns the per-tick outputs and the recorded passes."""
    passes = record_passes(engine)
    audio = {s: speech_like(10 + s, live_frames) for s in (0, 1)}
    fed = {0: 0, 1: 0}
    paused_ticks = 0
    ticks = []
    engine.open_slot(0, configs[0])
    for tick in range(max_ticks):
        if tick == JOIN_TICK:
            engine.open_slot(1, configs[1])
        inputs = {}
        for s in (0, 1):
            st = engine._slots.get(s)
            if st is None or not st.live or fed[s] >= live_frames:
                continue
            if s == 0 and fed[0] == PAUSE.start and paused_ticks < len(PAUSE):
                paused_ticks += 1  # slot 0 sits out while slot 1 talks: its rows must not move
                continue
            inputs[s] = SlotInput(audio=audio[s][fed[s] * 1920 : (fed[s] + 1) * 1920])
            fed[s] += 1
        out = engine.step(inputs)
        ticks.append({s: (o.text, o.prefilling, round(o.progress, 6), o.audio.copy()) for s, o in out.items()})
        if fed == {0: live_frames, 1: live_frames}:
            break
    assert fed == {0: live_frames, 1: live_frames}, "the script did not finish"
    assert paused_ticks == len(PAUSE)
    return ticks, passes


def assert_same_run(eager_run, fast_run) -> None:
    (eager_ticks, eager_passes), (fast_ticks, fast_passes) = eager_run, fast_run
    assert len(eager_passes) == len(fast_passes)
    for i, (a, b) in enumerate(zip(eager_passes, fast_passes, strict=True)):
        assert a == b, f"pass {i}: eager {a[0]} {a[1][0][:9]} vs fast {b[0]} {b[1][0][:9]}"
    assert len(eager_ticks) == len(fast_ticks)
    for i, (a, b) in enumerate(zip(eager_ticks, fast_ticks, strict=True)):
        assert a.keys() == b.keys(), f"tick {i}"
        for s in a:
            assert a[s][:3] == b[s][:3], f"tick {i} slot {s}"
            np.testing.assert_allclose(a[s][3], b[s][3], rtol=0, atol=1e-6, err_msg=f"tick {i} slot {s} pcm")


def make_engine(checkpoint: Path, backend: str, budget_ms: float) -> LockstepEngine:
    engine = LockstepEngine(checkpoint, 2, greedy=True, prefill_budget_ms=budget_ms, backend=backend)
    engine.warmup()
    assert engine.backend.name == backend
    return engine


@pytest.mark.parametrize("budget_ms", [0.0, 1e9], ids=["one-prefill-frame-per-tick", "whole-prefill-in-a-tick"])
def test_personaplex_fast_backend_equals_eager_backend(budget_ms):
    """Golden PersonaPlex ckpt. Budget 0: each prefill frame rides along the live pass (mixed rows); an unbounded
    budget: the rest of a prefill runs in prefill-only passes within one tick. Both are timing-independent."""
    configs = {
        0: SlotConfig(persona=PERSONA, voice=VoiceRef("pt", DATA / "voice_prompt.pt")),
        1: SlotConfig(persona="You enjoy talking about trains.", voice=VoiceRef("wav", DATA / "voice_prompt.wav")),
    }
    runs = {}
    for backend in ("eager", "fast"):
        engine = make_engine(DATA / "ckpt", backend, budget_ms)
        runs[backend] = run_script(engine, configs, live_frames=24)
        runs[backend + "_state"] = [engine.backend.slot_state(s) for s in (0, 1)]
    assert_same_run(runs["eager"], runs["fast"])
    for (c0, p0, n0), (c1, p1, n1) in zip(runs["eager_state"], runs["fast_state"], strict=True):
        assert torch.equal(c0, c1) and torch.equal(p0, p1) and n0 == n1
    ticks, passes = runs["fast"]
    mixed = [p for p in passes if len(p[0]) > 1]
    assert mixed, "some pass must hold a live row and a prefill row together"
    texts = {s: "".join(t[s][0] for t in ticks if s in t) for s in (0, 1)}
    assert texts[0] and texts[0] != texts[1]


def test_moshiko_fast_backend_equals_eager_backend(moshiko_dir):
    configs = {0: SlotConfig(), 1: SlotConfig()}
    runs = [
        run_script(make_engine(moshiko_dir, backend, 30.0), configs, live_frames=30) for backend in ("eager", "fast")
    ]
    assert_same_run(*runs)
    ticks, _ = runs[1]
    assert any(t[s][0] for t in ticks for s in t), "the model produced some text"


def test_fast_backend_on_cpu_is_the_graph_free_fast_path_and_keeps_slots_apart(moshiko_dir):
    engine = make_engine(moshiko_dir, "fast", 30.0)
    backend = engine.backend
    assert isinstance(backend, FastBackend) and engine.gen is backend.lockstep
    assert backend.graphed.graphs == {} and not backend.mimi_graphed  # CPU: torch twins, eagerly
    assert backend.graphed.buckets == (1, 2) and not backend.lockstep.kv.fp8
    assert engine.memory_snapshot()["lm_kv_bytes"] > 0
    # a paused slot's LM state and codec rows are untouched by the other slot's ticks
    engine.open_slot(0, SlotConfig())
    engine.open_slot(1, SlotConfig())
    engine.step({})  # both go live (Moshi has no prefill)
    frame = speech_like(0, 1)
    engine.step({0: SlotInput(audio=frame), 1: SlotInput(audio=frame)})
    before = backend.slot_state(1)
    codec_before = [t.clone() for t in _codec_rows(backend, 1)]
    for _ in range(3):
        engine.step({0: SlotInput(audio=frame)})
    after = backend.slot_state(1)
    assert all(torch.equal(a, b) for a, b in zip(before[:2], after[:2], strict=True)) and before[2] == after[2]
    assert all(torch.equal(a, b) for a, b in zip(codec_before, _codec_rows(backend, 1), strict=True))
    assert backend.slot_state(0)[2] == before[2] + 3


def _codec_rows(backend: FastBackend, slot: int) -> list[torch.Tensor]:
    from inference.models.moshi.mimi import state_tensors

    state = backend.mimi.state
    row = backend.mimi.row_of[slot]
    return [t[row].clone() for _, t in state_tensors(state) if t.dim() and t.shape[0] == state.batch_size]


def test_backend_choice_and_bad_names(moshiko_dir):
    with pytest.raises(EngineError, match="backend must be one of"):
        LockstepEngine(moshiko_dir, 1, backend="turbo")
    engine = LockstepEngine(moshiko_dir, 1)
    engine.warmup()
    assert isinstance(engine.backend, FastBackend)  # auto: the fast path on CPU too (measured faster here)
    eager = LockstepEngine(moshiko_dir, 1, backend="eager")
    eager.warmup()
    assert isinstance(eager.backend, EagerBackend) and eager.gen is eager.backend.gen


def test_fast_backend_sampling_follows_the_engine_seed(moshiko_dir):
    def sampled_text(seed: int) -> list[str]:
        engine = LockstepEngine(moshiko_dir, 1, seed=seed, backend="fast")
        engine.warmup()
        engine.open_slot(0, SlotConfig())
        engine.step({})
        audio = speech_like(5, 25)
        return [engine.step({0: SlotInput(audio=audio[i * 1920 : (i + 1) * 1920])})[0].text for i in range(25)]

    first = sampled_text(7)
    torch.manual_seed(123)  # the global RNG must not matter
    assert sampled_text(7) == first
    assert sampled_text(8) != first


def test_calls_left_on_high_slots_move_to_lower_codec_rows_and_say_the_same(moshiko_dir):
    """20 calls, then the first 16 end: the 4 left on slots 16-19 move to rows 3-0, one a tick, so Mimi runs over
    16 rows instead of 32; their tokens and text are exactly, and their audio within float noise, what they are
    on an engine whose calls keep their rows."""
    frames = {s: speech_like(s, 12) for s in range(20)}

    def run(compact: bool) -> tuple[LockstepEngine, list[dict]]:
        engine = LockstepEngine(moshiko_dir, 40, greedy=True, backend="fast")
        engine.warmup()
        if not compact:
            engine.backend.mimi.compact = lambda open_slots: False
        for s in range(20):
            engine.open_slot(s, SlotConfig())
        engine.step({})  # all live (Moshi has no prefill)
        ticks = []
        for k in range(12):
            if k == 4:
                for s in range(16):
                    engine.close_slot(s)
            live = range(20) if k < 4 else range(16, 20)
            frame = {s: SlotInput(audio=frames[s][k * 1920 : (k + 1) * 1920]) for s in live}
            ticks.append(engine.step(frame))
        return engine, ticks

    moved, moved_ticks = run(compact=True)
    kept, kept_ticks = run(compact=False)
    mimi = moved.backend.mimi
    assert [mimi.row_of[s] for s in range(16, 20)] == [3, 2, 1, 0] and mimi.moves == 4  # the highest moves first
    assert mimi.prefix_for(3) == 16 and kept.backend.mimi.prefix_for(19) == 32
    for k, (a, b) in enumerate(zip(moved_ticks, kept_ticks, strict=True)):
        assert a.keys() == b.keys()
        for s in a:
            assert (a[s].tokens, a[s].text) == (b[s].tokens, b[s].text), f"tick {k}, slot {s}"
            np.testing.assert_allclose(a[s].audio, b[s].audio, rtol=0, atol=1e-5, err_msg=f"tick {k}, slot {s}")
