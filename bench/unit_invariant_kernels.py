"""The row-invariant kernels against torch's (cuBLAS, SDPA) at the unit LLM's shapes, bf16, one GPU.

Each op is captured in a CUDA graph of ``REPS`` back-to-back launches (as the fast path replays them), so the
times are device time per op without Python in between. Prints microseconds per op and the ratio to torch.

Usage (GPU machine): python3 bench/unit_invariant_kernels.py --out $OUT   # invariant-kernels-<gpu>-<commit>.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_result  # noqa: E402
from inference.models.minicpmo.invariant import kernels  # noqa: E402

REPS = 50
D, Q_HEADS, KV_HEADS, HD, FFN, VOCAB = 4096, 32, 8, 128, 12288, 151748  # Qwen3-8B


def graphed_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            fn()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / REPS)
    return sorted(times)[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="a file, or a directory for the named result")
    args = parser.parse_args()
    bf16 = torch.bfloat16
    rows = []
    weights = {
        "qkv": (Q_HEADS * HD + 2 * KV_HEADS * HD, D), "o_proj": (D, Q_HEADS * HD), "gate_up": (2 * FFN, D),
        "down": (D, FFN), "lm_head": (VOCAB, D),
    }  # fmt: skip
    for m in (1, 16, 256, 2048):
        for name, (n, k) in weights.items():
            if name == "lm_head" and m > 16:
                continue
            x = torch.randn(m, k, device="cuda", dtype=bf16)
            w = torch.randn(n, k, device="cuda", dtype=bf16)
            ours, theirs = graphed_us(partial(kernels.linear, x, w)), graphed_us(partial(F.linear, x, w))
            rows.append({"op": f"linear {name}", "rows": m, "ours_us": round(ours, 1), "torch_us": round(theirs, 1),
                         "ratio": round(ours / theirs, 2)})  # fmt: skip
            print(rows[-1], flush=True)
    for r, t, kv_len in ((1, 1, 1024), (16, 1, 2048), (1, 16, 1024), (16, 16, 1024)):
        pool_k = torch.randn(r + 1, KV_HEADS, kv_len, HD, device="cuda", dtype=bf16)
        pool_v = torch.randn_like(pool_k)
        q = torch.randn(r, Q_HEADS, t, HD, device="cuda", dtype=bf16)
        slots = torch.arange(r, device="cuda")
        starts = torch.full((r,), kv_len - t, device="cuda")
        ks, vs = pool_k[:r], pool_v[:r]
        ours = partial(kernels.attention, q, pool_k, pool_v, slots, starts, kv_len, HD**-0.5, causal=True)
        theirs = partial(F.scaled_dot_product_attention, q, ks, vs, enable_gqa=True, scale=HD**-0.5)
        a, b = graphed_us(ours), graphed_us(theirs)
        rows.append({"op": "attention", "rows": r, "positions": t, "kv_len": kv_len, "ours_us": round(a, 1),
                     "torch_us": round(b, 1), "ratio": round(a / b, 2)})  # fmt: skip
        print(rows[-1], flush=True)
    x = torch.randn(16, D, device="cuda", dtype=bf16)
    w = torch.randn(D, device="cuda", dtype=bf16)
    a, b = graphed_us(lambda: kernels.rms_norm(x, w, 1e-6)), graphed_us(lambda: F.rms_norm(x, (D,), w, 1e-6))
    rows.append({"op": "rms_norm", "rows": 16, "ours_us": round(a, 1), "torch_us": round(b, 1)})
    print(rows[-1], flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    print(f"wrote {write_result(result, 'invariant-kernels', gpu=True, out=args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
