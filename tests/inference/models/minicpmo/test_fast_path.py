"""The unit engine's fast path (static KV pools, batched decode steps) against the goldens and the eager path.

On a CPU the fast runner runs its decode step eagerly at the same bucketed shapes the CUDA graphs replay
(tests/gpu/test_fast_unit.py replays the graphs), so these tests check the static-cache arithmetic, the
row batching across sessions and the sliding window on the static cache. Tokens, codes and lengths exactly;
margins within the golden tests' tolerance.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from inference.engines.base import SlotConfig, SlotInput, VoiceRef
from inference.engines.unit import UnitEngine
from inference.models.minicpmo.audio_encoder import AudioStreamState
from inference.models.minicpmo.duplex import MAX_STEPS_PER_UNIT, DuplexRunner
from inference.models.minicpmo.fast.audio import FastAudio
from inference.models.minicpmo.fast.graphs import T_BUCKETS
from inference.models.minicpmo.fast.runner import FastDuplexRunner
from inference.models.minicpmo.fast.streams import RecordedCall, run_calls
from inference.models.minicpmo.fast.tts import FastTTS
from tests.inference.models.minicpmo.steering import (
    early_stopping_tts,
    golden_calls,
    listen_likely,
    run_to_the_cap,
    two_units_fast_and_eager,
)

EXACT = ("llm_ids", "text", "tts_codes", "kv_len", "is_listen", "end_of_turn", "prefill_schema")


def _assert_same_units(mine: list[dict], theirs: list[dict]) -> None:
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        for field in EXACT:
            assert a[field] == b[field], f"unit {b['unit']} field {field}"
        np.testing.assert_allclose(a["raw_top2_margins"], b["raw_top2_margins"], rtol=0, atol=5e-5)


def test_three_calls_batched_reproduce_their_goldens(minicpmo_parts, minicpmo_data_dir):
    goldens, calls = golden_calls(minicpmo_data_dir)
    runner = FastDuplexRunner(minicpmo_parts, num_slots=4)
    records = run_calls(runner, calls)  # every tick decides the live calls in shared steps
    for recs, golden in zip(records, goldens, strict=True):
        _assert_same_units(recs, golden["units"])
    assert any(len(u["tts_codes"]) == 25 for recs in records for u in recs)
    # Every session went back to the pools when its call object was dropped.
    assert len(runner.fast_llm.pool.free) == 4 and len(runner.fast_tts.pool.free) == 4


def test_sliding_window_on_the_static_cache_matches_the_eager_window(minicpmo_parts, minicpmo_data_dir):
    options = json.loads((minicpmo_data_dir / "turnclose10" / "golden.json").read_text())["options"]
    base = RecordedCall.from_scenario(minicpmo_data_dir / "turnclose10", options)
    rng = np.random.default_rng(0)
    audio = np.concatenate([base.audio, base.audio[:64000]])
    audio = audio + rng.normal(0, 1e-3, audio.shape[0]).astype(np.float32)
    # Forced listens keep the CPU run short; the speaking units left still cross the window several times.
    call = RecordedCall(audio=audio, ref_audio=base.ref_audio, force_listen_units={6, 8, 10, 12})
    eager = DuplexRunner(minicpmo_parts, window_max=150, window_target=100)
    fast = FastDuplexRunner(minicpmo_parts, num_slots=1, capacity=256, window_max=150, window_target=100)
    want = run_calls(eager, [call])[0]
    got = run_calls(fast, [call])[0]
    _assert_same_units(got, want)
    lengths = [u["kv_len"] for u in want]
    assert max(lengths) <= 150 and any(b < a for a, b in zip(lengths, lengths[1:], strict=False)), "the window slid"
    assert sum(not u["is_listen"] for u in want) >= 4


def test_engine_fast_and_eager_serve_the_same_call(minicpmo_checkpoint, minicpmo_data_dir):
    audio = np.load(minicpmo_data_dir / "audio8" / "user_audio.npy").astype(np.float32)
    voice = VoiceRef("ref", minicpmo_data_dir / "audio8" / "ref_audio.npy")
    outputs = {}
    for fast in (False, True):
        engine = UnitEngine(minicpmo_checkpoint, num_slots=2, fast=fast)
        engine.warmup()
        for slot in (0, 1):
            engine.open_slot(slot, SlotConfig(voice=voice))
        while any(out.prefilling for out in engine.step({}).values()):  # the prepares may take more than one tick
            pass
        ticks = []
        for u in range(6):
            chunk = audio[u * 16000 : (u + 1) * 16000]
            # Slot 1 runs half a second behind slot 0, so the two decide different things in one tick.
            other = audio[u * 16000 + 8000 : (u + 1) * 16000 + 8000]
            out = engine.step({0: SlotInput(audio=chunk), 1: SlotInput(audio=other, force_listen=u == 4)})
            ticks.append({s: (o.decision, o.text, o.end_of_turn) for s, o in sorted(out.items())})
        for slot in (0, 1):
            engine.close_slot(slot)
        outputs[fast] = ticks
        if fast:
            assert len(engine.runner.fast_llm.pool.free) == 3  # both sessions (and the warm-up one) returned
    assert outputs[True] == outputs[False]
    assert any(d == "speak" for tick in outputs[True] for d, _, _ in tick.values())


def test_full_pool_is_a_clear_error(minicpmo_parts):
    runner = FastDuplexRunner(minicpmo_parts, num_slots=1)
    kept = runner.new_session()
    with pytest.raises(RuntimeError, match="KV slots are in use"):
        runner.new_session()
    del kept
    runner.new_session()  # the dropped session's slot came back


def test_padded_runs_of_mixed_lengths_equal_unpadded_eager_feeds(minicpmo_parts):
    """Runs of 13, 40 and 150 positions (150: two chunks) share padded forwards; each equals the eager LLM's
    feed of the same run, the keys land at the real positions only, and nothing past a run is written."""
    runner = FastDuplexRunner(minicpmo_parts, num_slots=3, capacity=512)
    llm, eager = runner.fast_llm, minicpmo_parts.llm
    gen = torch.Generator().manual_seed(0)
    dim = llm.hidden_size
    lengths = (13, 40, 150)
    assert lengths[-1] > T_BUCKETS[-1]
    prompts = [torch.randn(n, dim, generator=gen) * 0.5 for n in (5, 30, 7)]  # different start positions
    runs = [torch.randn(n, dim, generator=gen) * 0.5 for n in lengths]
    caches = [llm.new_cache() for _ in lengths]
    eager_caches = [eager.new_cache() for _ in lengths]
    want = []
    for cache, eager_cache, prompt, run in zip(caches, eager_caches, prompts, runs, strict=True):
        llm.feed(cache, prompt)
        eager.feed(eager_cache, prompt)
        want.append(eager.feed(eager_cache, run)[-1])
    hidden, logits = llm.feed_many(caches, runs)
    np.testing.assert_allclose(hidden.numpy(), torch.stack(want).numpy(), rtol=0, atol=1e-4)
    np.testing.assert_allclose(logits.numpy(), eager.logits(torch.stack(want)).numpy(), rtol=0, atol=1e-4)
    for cache, eager_cache in zip(caches, eager_caches, strict=True):
        length = cache.length
        assert length == eager.cache_length(eager_cache)
        for layer, eager_layer in zip(llm.pool.keys, eager_cache.layers, strict=True):
            slot = layer[cache.slot]  # [H_kv, C, hd]
            np.testing.assert_allclose(slot[:, :length].numpy(), eager_layer.keys[0].numpy(), rtol=0, atol=1e-4)
            assert not slot[:, length:].any(), "padding wrote into the session's slot"


def test_batched_static_encoder_equals_the_eager_streaming_encoder(minicpmo_parts, minicpmo_data_dir):
    """Two sessions 5 units apart through one batched encoder forward per tick for 36 s: a first unit beside
    later ones, every kv bucket, and the cache restart before the 1500 learned positions run out."""
    audio = np.load(minicpmo_data_dir / "turnclose10" / "user_audio.npy").astype(np.float32)
    rng = np.random.default_rng(1)
    units = [
        audio[(u % 10) * 16000 : (u % 10 + 1) * 16000] + rng.normal(0, 1e-3, 16000).astype(np.float32)
        for u in range(36)
    ]
    fast = FastAudio(minicpmo_parts.audio, num_slots=2, max_rows=2)
    states, eager_states = [fast.new_state(), fast.new_state()], [AudioStreamState(), AudioStreamState()]
    for tick in range(36):
        live = [k for k, lag in enumerate((0, 5)) if tick >= lag]
        got = fast.embed_units([states[k] for k in live], [units[tick - 5 * k] for k in live])
        for row, k in enumerate(live):
            want, _ = minicpmo_parts.audio.embed_unit(eager_states[k], units[tick - 5 * k])
            np.testing.assert_allclose(got[row].numpy(), want.numpy(), rtol=0, atol=1e-4, err_msg=f"tick {tick}")
            assert states[k].cached_frames == eager_states[k].cached_frames
    assert states[0].cached_frames == (36 - 29) * 50  # restarted once, before unit 29


def test_tts_units_that_stop_early_equal_the_eager_decode(minicpmo_parts):
    """Rows reaching eos at different codes (and one that may not stop) decode together exactly as each alone on
    the eager TTS, through two units of the turn: the steps a stopped row is fed until the host reads that
    every row has stopped leave its codes and its next unit untouched."""
    tts, conditions, min_codes = early_stopping_tts(minicpmo_parts)
    fast = FastTTS(tts, num_slots=8, max_rows=8)
    lengths = two_units_fast_and_eager(fast, tts, conditions, min_codes)
    assert len(lengths) >= 5 and 25 in lengths and min(lengths) < 8, lengths


def _fast_and_eager(parts, calls) -> tuple[list, list]:
    """The calls decided together on the fast runner, and each alone on the eager one."""
    got = run_calls(FastDuplexRunner(parts, num_slots=4), calls)
    return got, [run_calls(DuplexRunner(parts), [call])[0] for call in calls]


def test_sessions_whose_next_id_the_step_ahead_guessed_wrong_are_fed_again(minicpmo_parts, minicpmo_data_dir):
    """The fast runner feeds each round's chosen ids a step ahead, before the host reads them. Mid-turn the
    decision logic turns ``<|listen|>`` into ``<|tts_bos|>``, so a session choosing it must be fed again at the
    same position. With listen made likely, the three calls decide together exactly as each alone on the eager
    runner, through many such re-feeds."""
    parts = listen_likely(minicpmo_parts)
    got, want = _fast_and_eager(parts, golden_calls(minicpmo_data_dir)[1])
    for mine, theirs in zip(got, want, strict=True):
        _assert_same_units(mine, theirs)
    tts_bos = DuplexRunner(parts).ids.tts_bos
    mid_turn_listens = sum(u["llm_ids"].count(tts_bos) for units in want for u in units)
    assert mid_turn_listens >= 10, mid_turn_listens


def test_units_that_reach_the_id_cap_equal_the_eager_path(minicpmo_parts, minicpmo_data_dir):
    """No golden unit decides its 19th id (the 28-character cap ends them first); steered to the cap, the units
    where the fast runner stops deciding equal the eager path."""
    parts = run_to_the_cap(minicpmo_parts)
    got, want = _fast_and_eager(parts, golden_calls(minicpmo_data_dir)[1])
    for mine, theirs in zip(got, want, strict=True):
        _assert_same_units(mine, theirs)
    chunk_eos = DuplexRunner(parts).ids.chunk_eos
    capped = [u for units in want for u in units if len(u["llm_ids"]) > MAX_STEPS_PER_UNIT]
    assert len(capped) >= 2 and all(u["llm_ids"][MAX_STEPS_PER_UNIT - 1] == chunk_eos for u in capped)
