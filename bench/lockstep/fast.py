"""The fast path driven by the bench's own loop over its graphs: step timings, graph == eager, profiles."""

from __future__ import annotations

import time

import torch

from bench.lockstep.common import GiB, free_memory, log, stats
from inference.models.moshi.fast.graphs import GraphedLockstep
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.model import FastLM
from inference.models.moshi.fast.session import live_forced
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.gen import SamplingConfig


def fill_rings_random(ls: FastLockstep) -> None:
    """Random fp8 / bf16 ring contents so that timed reads see real data (never zeros)."""
    for layer in range(len(ls.kv.keys)):
        for ring in (ls.kv.keys[layer], ls.kv.values[layer]):
            if ls.kv.fp8:
                ring.view(torch.uint8).random_(0, 0x78)  # finite positive e4m3 codes (0x7f is NaN)
            else:
                ring.normal_()
        if ls.kv.fp8:
            ls.kv.key_scales[layer].fill_(0.02)
            ls.kv.value_scales[layer].fill_(0.02)


def time_ours(gl: GraphedLockstep, batch_sizes: list[int], fills: dict[str, int], warmup: int, ticks: int) -> dict:
    ls = gl.lockstep
    c = ls.config
    out = {}
    for B in batch_sizes:
        slot_ids = torch.arange(B, device="cuda")
        res = {}
        for name, fill in fills.items():
            ls.set_passes(range(B), [fill] * B)
            codes = torch.randint(0, 2048, (B, 8), device="cuda")
            forced, mask = live_forced(c, codes)
            for _ in range(warmup):
                gl.step(slot_ids, forced, mask, slots=range(B))[0].cpu()
            times = []
            for _ in range(ticks):
                t = time.perf_counter()
                tok, _ = gl.step(slot_ids, forced, mask, slots=range(B))
                tok.cpu()
                times.append((time.perf_counter() - t) * 1e3)
            res[name] = stats(times)
        out[B] = res
        log(f"  ours B={B}: " + ", ".join(f"{k} {v['median']}/{v['p99']}" for k, v in res.items()))
    return out


def check_graph_equals_eager(fl: FastLM, batch_sizes: list[int], frames: int, kv_fp8: bool) -> dict:
    """Greedy tokens of the graphed fast step == the same step run eagerly, over ``frames`` frames.

    Both runs start from freshly reset slots and get the same random user codes; the eager run goes first and
    its tokens are kept, then the slots are reset and the graphed run replays the same inputs.
    """
    c = fl.config
    n_max = max(batch_sizes)
    ls = FastLockstep(fl, num_slots=n_max, max_rows=n_max, sampling=SamplingConfig(use_sampling=False), kv_fp8=kv_fp8)
    gl = GraphedLockstep(ls, buckets=batch_sizes)
    gl.capture()
    result = {}
    for B in batch_sizes:
        slots = torch.arange(B, device="cuda")
        runs = []
        for step in (ls.step_eager, gl.step):
            for s in range(B):
                ls.reset_slot(s)
            g = torch.Generator(device="cuda").manual_seed(B)
            tokens = []
            for _ in range(frames):
                codes = torch.randint(0, 2048, (B, 8), device="cuda", generator=g)
                forced, mask = live_forced(c, codes)
                tokens.append(step(slots, forced, mask)[0].clone())
            runs.append(torch.stack(tokens, 1))  # [B, frames, 1 + dep_q]
        mismatched = int((runs[0] != runs[1]).any(dim=2).sum())
        result[B] = {"frames": frames, "mismatched_row_frames": mismatched, "equal": mismatched == 0}
        log(f"  graph == eager, B={B}, fp8={kv_fp8}: {result[B]}")
    del gl, ls
    free_memory()
    return result


def max_slots(fl: FastLM, kv_fp8: bool, reserve_GiB: float, cap: int) -> int:
    free_memory()
    free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    per_slot = SlotKV.bytes_per_slot(fl.config, fl.dtype, kv_fp8)
    n = int((free - reserve_GiB * GiB) // per_slot) - 1
    return max(8, min(cap, n - n % 8))


def profile_eager_step(ls: FastLockstep, B: int, fill: int) -> dict:
    """Device time per kernel family of one eager step (no graph): where the tick goes, launch gaps excluded."""
    from torch.profiler import ProfilerActivity, profile

    c = ls.config
    slots = torch.arange(B, device="cuda")
    ls.set_passes(range(B), [fill] * B)
    forced, mask = live_forced(c, torch.randint(0, 2048, (B, 8), device="cuda"))
    ls.step_eager(slots, forced, mask)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ls.step_eager(slots, forced, mask)
        torch.cuda.synchronize()
    families = {
        "gemm": 0.0,
        "decode_attention": 0.0,
        "depformer_attention": 0.0,
        "rmsnorm": 0.0,
        "silu_gate": 0.0,
        "rope_kv_write": 0.0,
        "sampling": 0.0,
        "other": 0.0,
    }
    count = 0
    kernels = {}
    for evt in prof.key_averages():
        us = getattr(evt, "device_time_total", 0.0) or getattr(evt, "cuda_time_total", 0.0)
        if us <= 0 or evt.key.startswith("aten::") or evt.key.startswith("cuda"):
            continue
        name = evt.key
        low = name.lower()
        if "decode_attention" in low:
            fam = "decode_attention"
        elif "depformer_attention" in low:
            fam = "depformer_attention"
        elif "rmsnorm" in low:
            fam = "rmsnorm"
        elif "silu" in low:
            fam = "silu_gate"
        elif "rope" in low:
            fam = "rope_kv_write"
        elif any(k in low for k in ("gemm", "gemv", "nvjet", "xmma", "cutlass", "splitk", "matmul")):
            fam = "gemm"
        elif any(
            k in low
            for k in ("sample", "topk", "softmax", "exponential", "argmax", "sort", "radix", "bitonic", "distribution")
        ):
            fam = "sampling"
        else:
            fam = "other"
        families[fam] += us / 1e3
        count += evt.count
        kernels[name[:90]] = round(us / 1e3, 3)
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12])
    return {
        "B": B,
        "fill": fill,
        "device_ms_by_family": {k: round(v, 3) for k, v in families.items()},
        "device_ms_total": round(sum(families.values()), 3),
        "kernel_launches": count,
        "top_kernels_ms": top,
    }
