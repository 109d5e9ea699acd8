"""The fast path's CPU fallback: golden PersonaPlex session, slot isolation, bucket mapping, fp8 rings.

These run the same ``FastLockstep`` code the GPU graphs capture, with the torch twins of the Triton kernels.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from inference.models.moshi.fast import ops
from inference.models.moshi.fast.graphs import GraphedLockstep, bucket_for
from inference.models.moshi.fast.model import FastLM, default_attention_launch
from inference.models.moshi.fast.session import live_forced, prefill_steps_within, run_prefill
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.gen import LockstepGen
from inference.models.moshi.personaplex import build_prefill, load_voice_prompt, voice_frames_from_prompt
from tests.inference.models.moshi_fast.tiny_pack import DATA, GREEDY


@pytest.mark.parametrize("page", [None, 16], ids=["contiguous", "paged"])
def test_two_slots_replay_the_golden_session_while_a_third_slot_runs_other_audio(tiny, page):
    info, lm = tiny
    golden = np.load(DATA / "golden.npy")
    meta = json.loads((DATA / "golden.json").read_text())
    user_codes = torch.from_numpy(np.load(DATA / "user_codes.npy"))
    ls = FastLockstep(FastLM(lm), num_slots=3, max_rows=4, sampling=GREEDY, kv_page_size=page)
    gl = GraphedLockstep(ls, buckets=(1, 2, 4))  # no CUDA: the same row step, eagerly, padded to the bucket
    prompt = load_voice_prompt(DATA / "voice_prompt.pt", info.lm, ls.ct)
    frames = build_prefill(
        info.lm, voice=voice_frames_from_prompt(info.lm, prompt), persona_ids=meta["text_prompt_tokens"]
    ).frames
    run_prefill(gl.step, ls, [0, 2], frames)
    for slot in (0, 2):
        assert ls.cache[slot].tolist() == meta["prefill"]["token_cache_after"]
        assert ls.provided[slot].int().tolist() == [[int(v) for v in row] for row in meta["prefill"]["provided_after"]]
        assert int(ls.lengths[slot]) == meta["prefill"]["offset_after"] - 1  # passes = offset - hidden call
    noise = torch.Generator().manual_seed(0)
    out = []
    for k in range(user_codes.shape[1]):
        codes = torch.stack([user_codes[:, k], torch.randint(0, 2048, (8,), generator=noise), user_codes[:, k]])
        forced, mask = live_forced(info.lm, codes)
        tokens, valid = gl.step(torch.tensor([2, 1, 0]), forced, mask)  # slot 1: an unrelated fresh session
        assert bool(valid[0]) and bool(valid[2])
        out.append(tokens.clone())
    tokens = torch.stack(out, dim=1).numpy()
    assert (tokens[0] == golden).all()
    assert (tokens[2] == golden).all()
    assert not (tokens[1] == golden).all()


def test_fast_step_equals_native_eager_step(tiny):
    info, lm = tiny
    B, frames = 3, 40
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 2048, (frames, B, 8), generator=gen)
    eager = LockstepGen(lm, batch_size=B, sampling=GREEDY)
    fast = FastLockstep(FastLM(lm), num_slots=B, max_rows=B, sampling=GREEDY)
    slots = torch.arange(B)
    for t in range(frames):
        forced, mask = live_forced(info.lm, codes[t])
        expected = eager.step(forced, mask, torch.ones(B, dtype=torch.bool))
        tokens, valid = fast.step_eager(slots, forced, mask)
        assert torch.equal(tokens, expected.tokens), f"frame {t}"
        assert torch.equal(valid, expected.valid)


def test_frozen_slot_is_untouched_and_resumes_where_it_stopped(tiny):
    info, lm = tiny
    ls = FastLockstep(FastLM(lm), num_slots=2, max_rows=2, sampling=GREEDY)
    reference = FastLockstep(FastLM(lm), num_slots=1, max_rows=1, sampling=GREEDY)
    codes = torch.randint(0, 2048, (6, 8), generator=torch.Generator().manual_seed(2))
    expected = [
        reference.step_eager(torch.tensor([0]), *live_forced(info.lm, codes[t : t + 1]))[0].clone() for t in range(6)
    ]
    got = []
    for t in range(6):
        if t == 3:  # slot 0 sits out two ticks while slot 1 runs
            for _ in range(2):
                ls.step_eager(torch.tensor([1]), *live_forced(info.lm, codes[t : t + 1]))
        got.append(ls.step_eager(torch.tensor([0]), *live_forced(info.lm, codes[t : t + 1]))[0].clone())
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_bucket_mapping_and_prefill_budget():
    buckets = (1, 2, 4, 8, 16, 32, 64, 128, 160)
    assert [bucket_for(n, buckets) for n in (1, 3, 8, 9, 100, 129, 160)] == [1, 4, 8, 16, 128, 160, 160]
    with pytest.raises(ValueError):
        bucket_for(0, buckets)
    with pytest.raises(ValueError):
        bucket_for(161, buckets)
    assert prefill_steps_within(budget_ms=70, live_tick_ms=50, prefill_step_ms=9, pending=100) == 2
    assert prefill_steps_within(budget_ms=70, live_tick_ms=75, prefill_step_ms=9, pending=100) == 0
    assert prefill_steps_within(budget_ms=70, live_tick_ms=10, prefill_step_ms=9, pending=3) == 3
    with pytest.raises(ValueError):
        prefill_steps_within(budget_ms=70, live_tick_ms=10, prefill_step_ms=0, pending=3)
    assert default_attention_launch(1, 32).splits == 32
    assert default_attention_launch(128, 32).splits == 1


def test_out_of_range_slots_and_oversized_batches_are_refused(tiny):
    _, lm = tiny
    ls = FastLockstep(FastLM(lm), num_slots=2, max_rows=2, sampling=GREEDY)
    with pytest.raises(ValueError):
        ls.reset_slot(5)
    with pytest.raises(ValueError):
        ls.restore_token_cache(0, torch.zeros(3, 3, dtype=torch.long))
    K = lm.config.num_codebooks
    zeros, none = torch.zeros(1, K, dtype=torch.long), torch.zeros(1, K, dtype=torch.bool)
    with pytest.raises(ValueError):
        ls.load_rows(torch.arange(3), torch.zeros(3, K, dtype=torch.long), torch.zeros(3, K, dtype=torch.bool))
    with pytest.raises(ValueError):  # slot 2 does not exist (2 slots)
        ls.step_eager(torch.tensor([2]), zeros, none)
    with pytest.raises(ValueError):  # the same slot twice in one tick
        ls.step_eager(torch.tensor([0, 0]), zeros.expand(2, K), none.expand(2, K))
    with pytest.raises(ValueError):  # wrong shape
        ls.step_eager(torch.tensor([0]), torch.zeros(1, 3, dtype=torch.long), none)
    with pytest.raises(ValueError):  # an audio code past the codebook (forced)
        ls.step_eager(torch.tensor([0]), zeros + 5000, ~none)
    ls.step_eager(torch.tensor([0]), zeros + 5000, none)  # not forced: ignored


def test_fp8_quantisation_error_and_windowed_attention_reads_only_filled_entries():
    torch.manual_seed(3)
    x = torch.randn(64, 128) * 3
    q8, scale = ops.quantize_fp8(x)
    back = q8.float() * scale[:, None]
    assert ((back - x).norm() / x.norm()) < 0.05  # e4m3 has a 3-bit mantissa: ~3 % rms error
    S, H, C, D = 3, 2, 16, 8
    k_ring, v_ring = torch.randn(S, H, C, D), torch.randn(S, H, C, D)
    q = torch.randn(2, H, D)
    slots, lengths = torch.tensor([1, 2]), torch.tensor([5, 16])
    out = ops.decode_attention(q, ops.KVLayer.contiguous(k_ring, v_ring), slots, lengths)
    poisoned = k_ring.clone()
    poisoned[1, :, 5:] = float("nan")  # beyond slot 1's window: must never be read
    again = ops.decode_attention(q, ops.KVLayer.contiguous(poisoned, v_ring), slots, lengths)
    assert torch.equal(out, again)
    scores = q[0][:, None, :] @ k_ring[1, :, :5].transpose(1, 2) / D**0.5  # [H, 1, 5]
    manual = (torch.softmax(scores, dim=-1) @ v_ring[1, :, :5])[:, 0]
    torch.testing.assert_close(out[0].view(H, D), manual, rtol=1e-5, atol=1e-5)
    # the same rings stored in fp8 with per-vector scales give nearly the same attention
    k8, ks = ops.quantize_fp8(k_ring)
    v8, vs = ops.quantize_fp8(v_ring)
    out8 = ops.decode_attention(q, ops.KVLayer.contiguous(k8, v8, ks, vs), slots, lengths)
    assert ((out8 - out).norm() / out.norm()) < 0.05
