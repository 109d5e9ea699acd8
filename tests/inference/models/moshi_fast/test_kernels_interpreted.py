"""The Triton kernels, run by Triton's CPU interpreter, against their torch twins (float32, fresh random data).

The interpreter needs ``TRITON_INTERPRET=1`` before Triton is imported, so the checks run in a child
process. Skipped where Triton is not installed (the CPU torch wheel does not ship it).
"""

from __future__ import annotations

import textwrap

from tests.inference.triton_interpreter import needs_triton, run_interpreted

pytestmark = needs_triton

CHECKS = textwrap.dedent(
    """
    import torch
    from inference.models.moshi.fast import ops, triton_kernels as tk

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))

    torch.manual_seed(7)
    f32 = torch.float32
    x, alpha = torch.randn(3, 96), 1 + 0.1 * torch.randn(96)
    assert rel(tk.rmsnorm(x, alpha, 1e-8), ops.rmsnorm_torch(x, alpha, 1e-8)) < 1e-5
    g = torch.randn(3, 2 * 48)
    assert rel(tk.silu_mul(g), ops.silu_mul_torch(g)) < 1e-5

    for fp8 in (False, True):
        # contiguous rings (one page per slot) and the same rings cut into pages of 8 positions, the pages
        # scattered over the pool in no order and one slot's ring shrunk to 24 positions (3 pages)
        S, H, C, D, P = 4, 2, 40, 16, 8
        ring = ops.FP8_DTYPE if fp8 else f32
        rings = [torch.zeros(S, H, C, D, dtype=ring) for _ in range(2)]
        scales = [torch.ones(S, H, C) for _ in range(2)] if fp8 else [None, None]
        flat = ops.KVLayer.contiguous(*rings, *scales)
        twin = ops.KVLayer.contiguous(*[r.clone() for r in rings], *([s.clone() for s in scales] if fp8 else [None, None]))
        pool = 1 + S * C // P
        order = torch.randperm(pool - 1) + 1
        table = order[: S * (C // P)].view(S, C // P)
        windows = torch.tensor([C, C, C, 24])
        paged = ops.KVLayer(
            torch.zeros(pool, H, P, D, dtype=ring), torch.zeros(pool, H, P, D, dtype=ring),
            torch.ones(pool, H, P) if fp8 else None, torch.ones(pool, H, P) if fp8 else None, table, windows, C,
        )
        paged_twin = ops.KVLayer(*[t.clone() if t is not None else None for t in (
            paged.keys, paged.values, paged.key_scales, paged.value_scales)], table, windows, C)
        slots = torch.tensor([3, 0, 1])
        for p in range(0, 50, 3):  # wraps the ring of 40 (and slot 3's shrunk ring of 24)
            qkv = torch.randn(3, 3 * H * D)
            pos = torch.tensor([p, p + 1, p // 2])
            q = tk.rope_kv_write(qkv, flat, slots, pos, 10000.0)
            q_twin = ops.rope_kv_write_torch(qkv, twin, slots, pos, 10000.0)
            q_paged = tk.rope_kv_write(qkv, paged, slots, pos, 10000.0)
            ops.rope_kv_write_torch(qkv, paged_twin, slots, pos, 10000.0)
        assert rel(q, q_twin) < 1e-5 and torch.equal(q, q_paged)
        for mine, theirs in ((flat, twin), (paged, paged_twin)):  # what the kernel stored vs the twin
            if fp8:  # one e4m3 step apart at most (rounding of the conversion): ~3 % rms
                assert rel(mine.keys.float() * mine.key_scales[..., None],
                           theirs.keys.float() * theirs.key_scales[..., None]) < 0.05
            else:
                assert rel(mine.keys, theirs.keys) < 1e-6 and torch.equal(mine.values, theirs.values)
        two = torch.tensor([0, 1])  # full windows: the pages hold exactly what the contiguous rings hold
        assert torch.equal(ops.gather_rings(paged_twin.keys, paged_twin, two).float(), twin.keys[:2].float())
        assert torch.equal(ops.gather_rings(paged.values, paged, two).float(), flat.values[:2].float())
        lengths = torch.tensor([24, 1, 17])
        for layer in (flat, paged):  # the attention kernel against its twin over the same stored rings
            ref = ops.decode_attention_torch(q, layer, slots, lengths)
            for splits, block in ((1, 8), (4, 8), (2, 4)):
                out = tk.decode_attention(q, layer, slots, lengths, splits, block)
                assert rel(out, ref) < 1e-5, (fp8, splits, block, rel(out, ref))
        try:
            tk.decode_attention(q, paged, slots, lengths, 1, 16)
            raise AssertionError("a block spanning two pages was accepted")
        except ValueError:
            pass

    kc, vc = torch.zeros(3, 2, 8, 16), torch.zeros(3, 2, 8, 16)
    kt, vt = kc.clone(), vc.clone()
    for step in range(8):
        qkv = torch.randn(3, 3 * 2 * 16)
        out = tk.depformer_attention(qkv, kc, vc, step)
        ref = ops.depformer_attention_torch(qkv, kt, vt, step)
        assert rel(out, ref) < 1e-5

    base, table = torch.randn(4, 3 * 32)[:, 32:64], torch.randn(50, 32)
    tokens = torch.tensor([3, -1, -2, 49])
    assert torch.equal(tk.embed_add(base, table, tokens), ops.embed_add(base.contiguous(), table, tokens))

    w, res = torch.randn(40, 96) / 10, torch.randn(3, 40)
    assert rel(tk.small_gemv(x, w, norm_alpha=alpha, residual=res),
               res + ops.rmsnorm_torch(x, alpha, 1e-8) @ w.t()) < 1e-5
    gate_in = torch.randn(3, 192)
    assert rel(tk.small_gemv(gate_in, w, gate=True), ops.silu_mul_torch(gate_in) @ w.t()) < 1e-5
    logits, seeds = torch.randn(1, 64) * 3, torch.tensor([11])
    counts = torch.zeros(64)
    for _ in range(300):
        counts[tk.sample_top_k(logits, 0.8, 5, seeds, 1)] += 1
    top5 = torch.topk(logits, 5).indices
    assert counts[top5].sum() == 300 and int(seeds) == 311  # only top-k tokens; the RNG counter advanced
    print("ok")
    """
)


def test_triton_kernels_match_torch_twins_in_the_interpreter():
    run_interpreted(CHECKS)
