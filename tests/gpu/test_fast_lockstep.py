"""GPU fast path (graphed, Triton kernels) against the golden PersonaPlex pack and the native eager path.

Skipped without CUDA (CI). The tiny golden checkpoint runs in float32, where the fast path must reproduce the
reference's greedy tokens exactly; the full-size bf16 comparison (graphed == eager, same kernels) lives in
``bench/lockstep_gpu.py`` because it needs the 7B shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from inference.models.moshi.config import read_checkpoint_dir  # noqa: E402
from inference.models.moshi.fast import ops  # noqa: E402
from inference.models.moshi.fast.graphs import GraphedLockstep  # noqa: E402
from inference.models.moshi.fast.model import FastLM  # noqa: E402
from inference.models.moshi.fast.session import live_forced, run_prefill  # noqa: E402
from inference.models.moshi.fast.step import FastLockstep  # noqa: E402
from inference.models.moshi.gen import LockstepGen, SamplingConfig  # noqa: E402
from inference.models.moshi.loading import load_lm  # noqa: E402
from inference.models.moshi.personaplex import build_prefill, load_voice_prompt, voice_frames_from_prompt  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "personaplex"
GREEDY = SamplingConfig(use_sampling=False)


@pytest.fixture(scope="module")
def tiny():
    info = read_checkpoint_dir(DATA / "ckpt")
    lm = load_lm(info.moshi_weights, info.lm, device="cuda", dtype=torch.float32)
    return info, lm


def test_graphed_fast_path_reproduces_the_golden_session_at_1_and_64_slots(tiny):
    info, lm = tiny
    golden = np.load(DATA / "golden.npy")
    meta = json.loads((DATA / "golden.json").read_text())
    user_codes = torch.from_numpy(np.load(DATA / "user_codes.npy")).cuda()
    ls = FastLockstep(FastLM(lm), num_slots=65, max_rows=64, sampling=GREEDY)
    gl = GraphedLockstep(ls, buckets=(1, 64))
    gl.capture()
    assert set(gl.graphs) == {1, 64}
    prompt = load_voice_prompt(DATA / "voice_prompt.pt", info.lm, ls.ct)
    frames = build_prefill(
        info.lm, voice=voice_frames_from_prompt(info.lm, prompt), persona_ids=meta["text_prompt_tokens"]
    ).frames
    for B, first in ((1, 64), (64, 0)):  # B=1 on slot 64, then 64 rows on slots 0..63
        slots = list(range(first, first + B))
        for s in slots:
            ls.reset_slot(s)
        run_prefill(gl.step, ls, slots, frames)
        assert ls.cache[slots[0]].tolist() == meta["prefill"]["token_cache_after"]
        out = []
        for k in range(user_codes.shape[1]):
            forced, mask = live_forced(info.lm, user_codes[:, k].view(1, 8).expand(B, 8))
            out.append(gl.step(torch.tensor(slots, device="cuda"), forced, mask)[0].clone())
        tokens = torch.stack(out, dim=1).cpu().numpy()  # [B, 150, 17]
        for row in range(B):
            assert (tokens[row] == golden).all(), f"B={B} row {row} differs from the golden frames"


@pytest.mark.parametrize("fp8", [False, True])
def test_paged_kv_gives_the_contiguous_tokens_on_the_gpu_kernels(tiny, fp8):
    """Pages of 64 frames scattered over the pool, slots joining at different times, 360 frames (past the
    299-frame window): the same greedy tokens as contiguous rings, with one attention launch for both (the
    same blocks in the same order, so the same sums)."""
    info, lm = tiny
    fast_lm = FastLM(lm)
    fast_lm.attention_launch.update({b: ops.AttentionLaunch(splits=2, block_n=64) for b in (1, 2, 4)})
    gen = torch.Generator(device="cuda").manual_seed(3)
    codes = torch.randint(0, 2048, (360, 4, 8), device="cuda", generator=gen)
    runs = []
    for page in (None, 64):
        ls = FastLockstep(fast_lm, num_slots=4, max_rows=4, sampling=GREEDY, kv_fp8=fp8, kv_page_size=page)
        gl = GraphedLockstep(ls, buckets=(1, 2, 4))
        gl.capture()
        out = []
        for t in range(360):
            live = [0, 1, 2, 3] if t >= 70 else [0, 2]  # slots 1 and 3 join late: interleaved pages
            forced, mask = live_forced(info.lm, codes[t, live])
            out.append(gl.step(torch.tensor(live, device="cuda"), forced, mask, slots=live)[0].cpu())
        runs.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


@pytest.mark.parametrize("B", [1, 64])
def test_graphed_fast_path_equals_native_eager_path_over_200_frames(tiny, B):
    info, lm = tiny
    frames = 200
    gen = torch.Generator(device="cuda").manual_seed(B)
    codes = torch.randint(0, 2048, (frames, B, 8), device="cuda", generator=gen)
    eager = LockstepGen(lm, batch_size=B, sampling=GREEDY)
    ls = FastLockstep(FastLM(lm), num_slots=B, max_rows=B, sampling=GREEDY)
    gl = GraphedLockstep(ls, buckets=(B,))
    gl.capture()
    everyone = torch.ones(B, dtype=torch.bool, device="cuda")
    slots = torch.arange(B, device="cuda")
    for t in range(frames):
        forced, mask = live_forced(info.lm, codes[t])
        expected = eager.step(forced, mask, everyone)
        tokens, valid = gl.step(slots, forced, mask)
        assert torch.equal(valid, expected.valid), f"frame {t}"
        assert torch.equal(tokens, expected.tokens), (
            f"frame {t}: fast {tokens[0].tolist()} eager {expected.tokens[0].tolist()}"
        )


@pytest.mark.parametrize("fp8", [False, True])
def test_triton_kernels_match_their_torch_twins(fp8):
    if not ops.triton_available():
        pytest.skip("Triton not installed")
    torch.manual_seed(0)
    R, H, D, C, S = 5, 8, 128, 700, 9
    dt = torch.bfloat16
    ring_dtype = ops.FP8_DTYPE if fp8 else dt
    k_ring = torch.zeros(S, H, C, D, device="cuda", dtype=ring_dtype)
    v_ring = torch.zeros_like(k_ring)
    scales = [torch.ones(S, H, C, device="cuda") for _ in range(2)] if fp8 else [None, None]
    kv = ops.KVLayer.contiguous(k_ring, v_ring, *scales)
    twin = ops.KVLayer.contiguous(k_ring.clone(), v_ring.clone(), *[s.clone() if fp8 else None for s in scales])
    slots = torch.tensor([3, 0, 8, 5, 1], device="cuda")
    for p in range(0, 760, 3):  # wraps the ring
        qkv = torch.randn(R, 3 * H * D, device="cuda", dtype=dt)
        pos = torch.tensor([p, p + 1, p // 2, p // 3, 0], device="cuda")
        q = ops.rope_kv_write(qkv, kv, slots, pos, 10000.0)
        q_twin = ops.rope_kv_write_torch(qkv, twin, slots, pos, 10000.0)
    assert (q.float() - q_twin.float()).abs().max() <= 0.0625
    lengths = torch.tensor([700, 1, 300, 64, 65], device="cuda")
    reference = ops.decode_attention_torch(q, kv, slots, lengths).float()
    for launch in (ops.AttentionLaunch(1, 64), ops.AttentionLaunch(4, 128, 8), ops.AttentionLaunch(32, 32)):
        out = ops.decode_attention(q, kv, slots, lengths, launch).float()
        rel = (out - reference).norm() / reference.norm()
        assert rel < 1e-2, f"{launch}: relative error {rel}"
    x = torch.randn(R, 4096, device="cuda", dtype=dt)
    alpha = 1 + 0.1 * torch.randn(4096, device="cuda")
    rel = (ops.rmsnorm(x, alpha, 1e-8).float() - ops.rmsnorm_torch(x, alpha, 1e-8).float()).norm() / x.float().norm()
    assert rel < 1e-2
    for kwargs in ({}, {"norm_alpha": alpha[:1024]}, {"gate": True}):
        for rows in (1, 3):
            xin = torch.randn(rows, 2048 if kwargs.get("gate") else 1024, device="cuda", dtype=dt)
            w = torch.randn(3072, 1024, device="cuda", dtype=dt) / 32
            res = torch.randn(rows, 3072, device="cuda", dtype=dt)
            fused = ops.small_gemv(xin, w, residual=res, **kwargs).float()
            ref = xin
            if "norm_alpha" in kwargs:
                ref = ops.rmsnorm_torch(xin, kwargs["norm_alpha"], 1e-8)
            if kwargs.get("gate"):
                ref = ops.silu_mul_torch(xin)
            ref = (res + ref @ w.t()).float()
            assert (fused - ref).norm() / ref.norm() < 1e-2, f"small_gemv {list(kwargs)} rows={rows}"
