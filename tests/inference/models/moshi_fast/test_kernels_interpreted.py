"""The Triton kernels, run by Triton's CPU interpreter, against their torch twins (float32, fresh random data).

The interpreter needs ``TRITON_INTERPRET=1`` before Triton is imported, so the checks run in a child
process. Skipped where Triton is not installed (the CPU torch wheel does not ship it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")

ROOT = Path(__file__).resolve().parents[4]

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
        S, H, C, D = 4, 2, 40, 16
        ring = ops.FP8_DTYPE if fp8 else f32
        rings = [torch.zeros(S, H, C, D, dtype=ring) for _ in range(2)]
        scales = [torch.ones(S, H, C) for _ in range(2)] if fp8 else [None, None]
        twin = [r.clone() for r in rings] + ([s.clone() for s in scales] if fp8 else [None, None])
        slots = torch.tensor([3, 0, 1])
        for p in range(0, 50, 3):  # wraps the ring of 40
            qkv = torch.randn(3, 3 * H * D)
            pos = torch.tensor([p, p + 1, p // 2])
            q = tk.rope_kv_write(qkv, rings[0], rings[1], scales[0], scales[1], slots, pos, 10000.0)
            q_twin = ops.rope_kv_write_torch(qkv, *twin, slots, pos, 10000.0)
        assert rel(q, q_twin) < 1e-5
        if not fp8:
            assert rel(rings[0], twin[0]) < 1e-6 and torch.equal(rings[1], twin[1])  # v is stored as is
        lengths = torch.tensor([40, 1, 17])
        ref = ops.decode_attention_torch(q, rings[0], rings[1], scales[0], scales[1], slots, lengths)
        for splits, block in ((1, 16), (4, 8)):
            out = tk.decode_attention(q, rings[0], rings[1], scales[0], scales[1], slots, lengths, splits, block)
            assert rel(out, ref) < (2e-2 if fp8 else 1e-5), (fp8, splits, rel(out, ref))

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
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", CHECKS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
