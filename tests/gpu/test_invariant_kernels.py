"""The row-invariant kernels on a GPU, bfloat16: a row's bits do not depend on what else is in the batch.

This is the property the fast path's greedy equality stands on (a session's row in a padded 16-row graph
against the same row fed alone by the eager path), so it is checked bit for bit: rows alone and in batches of
other sizes, fused projections against their parts, a prefill's queries against the same queries in a padded,
pooled forward with a longer key bucket. Closeness to torch's own kernels is checked with tolerances.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from inference.models.minicpmo.invariant import kernels  # noqa: E402

BF16 = torch.bfloat16


def _close(a: torch.Tensor, b: torch.Tensor, rel: float) -> None:
    err = float((a.float() - b.float()).norm() / b.float().norm())
    assert err < rel, err


@pytest.mark.parametrize(("n", "k", "bias"), [(6144, 4096, False), (4096, 12288, False), (4096, 1024, True)])
def test_linear_rows_and_columns_are_the_same_bits_in_any_batch(n, k, bias):
    torch.manual_seed(0)
    x = torch.randn(300, k, device="cuda", dtype=BF16)
    w = torch.randn(n, k, device="cuda", dtype=BF16) * k**-0.5
    b = torch.randn(n, device="cuda", dtype=BF16) if bias else None
    small = kernels.linear(x[:64], w, b)  # 16 x 64 tiles; few of them: the pieces as programs, then summed
    _close(small, F.linear(x[:64], w, b), 1e-2)
    for m in (1, 2, 15, 16, 17):
        assert torch.equal(kernels.linear(x[:m], w, b), small[:m]), m
    assert torch.equal(kernels.linear(x[7:9], w, b), small[7:9])
    full = kernels.linear(x, w, b)  # 300 rows: the wide tiles, each program adding its pieces itself
    assert torch.equal(full[:64], small), "wide tiles round differently"
    part = slice(n // 3, n // 3 + 1024)  # a fused projection's part on its own (q of qkv, gate of gate_up)
    assert torch.equal(kernels.linear(x[:5], w[part], None if b is None else b[part]), small[:5, part])
    assert torch.equal(kernels.linear(x[:5].view(1, 5, k), w, b)[0], small[:5])


def test_norms_are_the_same_bits_in_any_batch():
    torch.manual_seed(1)
    x = torch.randn(40, 4096, device="cuda", dtype=BF16) * 3
    w = torch.randn(4096, device="cuda", dtype=BF16)
    full = kernels.rms_norm(x, w, 1e-6)
    xf = x.float()
    want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(BF16)  # Qwen3RMSNorm's order
    _close(full, want, 1e-2)
    assert torch.equal(kernels.rms_norm(x[3:4], w, 1e-6), full[3:4])
    qkv = torch.randn(6, 6144, device="cuda", dtype=BF16)  # per-head norms on a column slice
    heads = qkv[:, :4096].view(6, 32, 128)
    hw = torch.randn(128, device="cuda", dtype=BF16)
    assert torch.equal(kernels.rms_norm(heads, hw, 1e-6)[2:3], kernels.rms_norm(heads[2:3].contiguous(), hw, 1e-6))
    b = torch.randn(4096, device="cuda", dtype=BF16)
    ln = kernels.layer_norm(x, w, b, 1e-5)
    _close(ln, F.layer_norm(x, (4096,), w, b, 1e-5), 1e-2)
    assert torch.equal(kernels.layer_norm(x[5:7], w, b, 1e-5), ln[5:7])


@pytest.mark.parametrize("causal", [True, False])
def test_attention_prefill_alone_equals_the_same_queries_in_a_padded_pool(causal):
    torch.manual_seed(2)
    kv_heads, groups, hd, L, T = 8, 4, 128, 700, 15
    cache_k = torch.randn(1, kv_heads, L, hd, device="cuda", dtype=BF16)
    cache_v = torch.randn(1, kv_heads, L, hd, device="cuda", dtype=BF16)
    q = torch.randn(1, kv_heads * groups, T, hd, device="cuda", dtype=BF16)
    scale = hd**-0.5
    start = torch.tensor([L - T], device="cuda")
    alone = kernels.attention(q, cache_k, cache_v, torch.zeros(1, dtype=torch.long, device="cuda"), start, L, scale,
                              causal=causal)  # fmt: skip
    # reference closeness: SDPA over the same keys
    visible = torch.arange(L, device="cuda")[None, :] <= (L - T + torch.arange(T, device="cuda"))[:, None]
    want = F.scaled_dot_product_attention(
        q, cache_k.repeat_interleave(groups, 1), cache_v.repeat_interleave(groups, 1),
        attn_mask=visible if causal else None, scale=scale,
    ).transpose(1, 2)  # fmt: skip
    _close(alone, want, 2e-2)
    # the same session as row 2 of 5 in a pool (slot 3), its queries padded to 16 when causal (a prefill's
    # length bucket; an encoder unit is never padded), a 1024-key bucket
    width = 16 if causal else T
    pool_k = torch.randn(6, kv_heads, 2048, hd, device="cuda", dtype=BF16)
    pool_v = torch.randn(6, kv_heads, 2048, hd, device="cuda", dtype=BF16)
    pool_k[3, :, :L], pool_v[3, :, :L] = cache_k[0], cache_v[0]
    padded = torch.randn(5, kv_heads * groups, width, hd, device="cuda", dtype=BF16)
    padded[2, :, :T] = q[0]
    slots = torch.tensor([0, 1, 3, 4, 5], device="cuda")
    starts = torch.tensor([0, 100, L - T, 900, 3], device="cuda")
    batched = kernels.attention(padded, pool_k, pool_v, slots, starts, 1024, scale, causal=causal)
    assert torch.equal(batched[2, :T], alone[0])
    if not causal:
        return
    # a decode step's query alone on the cache and among other rows of the pool, 2048-key bucket
    zero = torch.zeros(1, dtype=torch.long, device="cuda")
    step = kernels.attention(q[:, :, -1:], cache_k, cache_v, zero, start + T - 1, L, scale, causal=True)
    assert torch.equal(step[0, 0], alone[0, -1])
    rows = padded[:, :, :1].clone()
    rows[2] = q[0, :, -1:]
    starts[2] = L - 1
    assert torch.equal(kernels.attention(rows, pool_k, pool_v, slots, starts, 2048, scale, causal=True)[2], step[0])
