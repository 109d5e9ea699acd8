"""One decode step of the unit engine's LLM and TTS at the real 4.5 shapes: kernels, time, eager vs compiled layers.

A speaking unit is a chain of up to 20 LLM steps and ~25 TTS steps, so the step's device time sets the unit's
tail (bench/notes/unit-gpu.md). This times the step as ``FastDuplexRunner`` launches it (``StepGraphs.step``,
CUDA-graphed), for the layers as plain torch ops and through ``torch.compile`` (``compile_steps``), and prints:
- per (model, compiled, rows, kv): device ms per step with nothing read between steps (``free``) and with the
  host reading each step's argmax (``read``), 200 steps back to back; the first step's time (compile + capture);
- the kernels of one un-graphed step (torch.profiler): count and device time by kernel name, top rows;
- numerics: 24 greedy LLM steps of both variants after the same random prefix (ids equal, max |logit| diff).

Usage (GPU machine)::

    python3 bench/unit_step_kernels.py --out $OUT/unit-step-kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.unit_gpu import build_model  # noqa: E402
from bench.unit_workload import REAL_45, sync  # noqa: E402
from inference.models.minicpmo.fast.runner import FastDuplexRunner  # noqa: E402

ROWS = (1, 16)
KV = (1024, 4096)


def step_times(graphs, rows: int, kv_len: int, reps: int) -> dict:
    scratch = graphs.pool.scratch
    slots, tokens, starts = [scratch] * rows, [0] * rows, [kv_len - 1] * rows
    sync()
    t0 = time.perf_counter()
    graphs.step(slots, tokens, starts)  # compile (first use) and capture
    sync()
    out = {"first_ms": round((time.perf_counter() - t0) * 1000, 1)}
    for mode in ("free", "read"):
        graphs.step(slots, tokens, starts)
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            _, logits = graphs.step(slots, tokens, starts)
            if mode == "read":
                int(logits[0].argmax())
        sync()
        out[f"{mode}_ms"] = round((time.perf_counter() - t0) * 1000 / reps, 3)
    return out


def kernel_table(graphs, rows: int, kv_len: int, runs: int = 10, top: int = 14) -> dict:
    """Kernels of ``runs`` un-graphed steps, per step: count and device microseconds by name."""
    from torch.profiler import ProfilerActivity, profile

    scratch = graphs.pool.scratch
    graphs.slots[:rows].fill_(scratch)
    graphs.starts[:rows].fill_(kv_len - 1)
    with torch.inference_mode():
        graphs._run(rows, kv_len)  # compiled code is ready before profiling
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                graphs._run(rows, kv_len)
            sync()
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type.name != "CUDA":
            continue
        row = by_name[event.name[:90]]
        row[0] += 1
        row[1] += event.device_time
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    return {
        "kernels_per_step": round(sum(c for c, _ in by_name.values()) / runs, 1),
        "device_us_per_step": round(sum(t for _, t in by_name.values()) / runs, 1),
        "top": [{"kernel": k, "per_step": round(c / runs, 1), "us": round(t / runs, 1)} for k, (c, t) in ranked[:top]],
    }


def attention_error() -> dict:
    """``decode_attention`` against SDPA over a gathered copy, bf16 at the LLM's shapes (random data)."""
    from torch.nn import functional as F

    from inference.models.minicpmo.fast.decode_attention import decode_attention

    out = {}
    gen = torch.Generator(device="cuda").manual_seed(3)
    for rows, kv_len in ((1, 1024), (16, 4096)):
        keys, values = (torch.randn(20, 8, 4096, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
        q = torch.randn(rows, 8, 4, 128, device="cuda", generator=gen).bfloat16()
        slots = torch.randperm(20, device="cuda", generator=gen)[:rows]
        lengths = torch.randint(1, kv_len + 1, (rows,), device="cuda", generator=gen)
        visible = torch.arange(kv_len, device="cuda")[None, None, None, :] < lengths[:, None, None, None]
        ref = F.scaled_dot_product_attention(
            q.float(), keys[slots, :, :kv_len].float(), values[slots, :, :kv_len].float(), attn_mask=visible
        )
        mine = decode_attention(q, keys, values, slots, lengths, kv_len, 128**-0.5).float()
        bf16_sdpa = F.scaled_dot_product_attention(
            q, keys[slots, :, :kv_len], values[slots, :, :kv_len], attn_mask=visible
        ).float()
        out[f"r{rows}_kv{kv_len}"] = {
            "rel_err_vs_fp32": float((mine - ref).norm() / ref.norm()),
            "sdpa_bf16_rel_err_vs_fp32": float((bf16_sdpa - ref).norm() / ref.norm()),
        }
    return out


@torch.inference_mode()
def greedy_ids(runner, seed: int, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    llm = runner.fast_llm
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prefix = (torch.randn(40, llm.hidden_size, generator=gen) * 0.02).to("cuda", torch.bfloat16)
    cache = llm.new_cache()
    _, logits = llm.feed_many([cache], [prefix])
    ids, kept = [], []
    for _ in range(steps):
        token = int(logits[0].argmax())
        ids.append(token)
        kept.append(logits[0].clone())
        _, logits = llm.feed_tokens([cache], [token])
    return ids, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.perf_counter()
    parts = build_model(torch.bfloat16, REAL_45, "cuda")
    result: dict = {
        "model": "MiniCPM-o 4.5 shapes, random bf16 (seed 0)",
        "build_s": round(time.perf_counter() - t0, 1),
    }
    result["decode_attention_bf16"] = attention_error()
    print("decode_attention bf16 vs SDPA", result["decode_attention_bf16"], flush=True)
    runners = {}
    for compiled in (False, True):
        name = "compiled_pool" if compiled else "eager_layers"
        runner = FastDuplexRunner(parts, num_slots=max(ROWS) + 1, compile_steps=compiled, pool_attention=compiled)
        runners[name] = runner
        for model in ("llm", "tts"):
            graphs = (runner.fast_llm if model == "llm" else runner.fast_tts).graphs
            for rows in ROWS:
                for kv_len in KV:
                    key = f"{model}_{name}_r{rows}_kv{kv_len}"
                    result[key] = step_times(graphs, rows, kv_len, args.reps)
                    print(key, json.dumps(result[key]), flush=True)
            result[f"kernels_{model}_{name}_r1_kv1024"] = table = kernel_table(graphs, 1, 1024)
            print(
                f"kernels {model} {name} r1 kv1024: {table['kernels_per_step']} per step, {table['device_us_per_step']} us"
            )
            for row in table["top"][:8]:
                print(f"  {row['per_step']:6.1f} {row['us']:8.1f} us  {row['kernel'][:80]}", flush=True)
    ids_e, logits_e = greedy_ids(runners["eager_layers"], 7, 24)
    ids_c, logits_c = greedy_ids(runners["compiled_pool"], 7, 24)
    same = sum(a == b for a, b in zip(ids_e, ids_c, strict=True))
    first_diff = next((i for i, (a, b) in enumerate(zip(ids_e, ids_c, strict=True)) if a != b), None)
    upto = first_diff if first_diff is not None else len(ids_e)
    diff = max(float((a - b).abs().max()) for a, b in zip(logits_e[: upto + 1], logits_c[: upto + 1], strict=True))
    result["greedy"] = {"steps": len(ids_e), "same_ids": same, "first_difference": first_diff, "max_logit_diff": diff}
    print("greedy", json.dumps(result["greedy"]), flush=True)
    print("\nstep ms (free / read), first use ms:")
    for key, value in result.items():
        if isinstance(value, dict) and "free_ms" in value:
            print(f"  {key:32s} {value['free_ms']:7.3f} / {value['read_ms']:7.3f}   first {value['first_ms']}")
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
