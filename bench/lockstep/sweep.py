"""The issue-5 sweep: reference vs fast path at B in {1, 8, 32, 64, 128, max} for dep_q 16 and 8, Mimi, bare ticks.

``bench/lockstep_gpu.py --legacy`` runs it (the command of the issue-5 results); the issue-13 round runs only the
parts it needs (``bench/lockstep_gpu.py`` without ``--legacy``).
"""

from __future__ import annotations

import json
import time

import torch

from bench.lockstep.codec import (
    build_mimi,
    check_graphed_mimi,
    realtime_ticks,
    time_graphed_mimi,
    time_mimi,
)
from bench.lockstep.common import GiB, free_memory, log, save
from bench.lockstep.fast import (
    check_graph_equals_eager,
    fill_rings_random,
    max_slots,
    profile_eager_step,
    time_ours,
)
from bench.lockstep.reference import build_reference, native_from_reference, time_reference
from inference.models.moshi.fast.codec import GraphedMimi
from inference.models.moshi.fast.graphs import GraphedLockstep
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.model import FastLM
from inference.models.moshi.fast.session import prefill_steps_within
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.fast.tuning import check_fused_gemv, tune_attention
from inference.models.moshi.gen import SamplingConfig


def run_config(dep_q: int, args, results: dict) -> None:
    key = f"dep_q{dep_q}"
    entry = results["configs"].setdefault(key, {})
    log(f"== {key}: building the reference LMModel (random bf16 weights on the GPU)")
    t0 = time.time()
    lm_ref = build_reference(dep_q)
    entry["params"] = sum(p.numel() for p in lm_ref.parameters())
    entry["weights_GiB"] = round(sum(p.numel() * p.element_size() for p in lm_ref.parameters()) / GiB, 2)
    log(f"   built in {time.time() - t0:.1f}s, {entry['params']} params")
    free, total = torch.cuda.mem_get_info()
    ref_max = int((free - 8 * GiB) // (1.46 * GiB))
    ref_sizes = [b for b in args.batch_sizes if b <= 64] + [ref_max - ref_max % 8]
    entry["reference"] = time_reference(lm_ref, ref_sizes, args.warmup, args.ticks)
    save(results, args.out)

    lm = native_from_reference(lm_ref, dep_q)
    del lm_ref
    free_memory()
    fl = FastLM(lm)
    entry["fused_small_gemv"] = check_fused_gemv(fl)
    log(f"   fused small-batch depformer GEMVs: {entry['fused_small_gemv']}")
    if dep_q == 16 and args.check_frames:
        entry["graph_equals_eager"] = {}
        for fp8 in (True, False):
            entry["graph_equals_eager"]["fp8" if fp8 else "bf16"] = check_graph_equals_eager(
                fl, [1, 64], args.check_frames, fp8
            )
        free_memory()
        save(results, args.out)
    n_slots = max_slots(fl, kv_fp8=True, reserve_GiB=args.reserve_gib, cap=args.max_slots)
    log(f"   ours: {n_slots} slots, fp8 KV at context {fl.config.context}")
    entry["kv_bytes_per_session_fp8"] = SlotKV.bytes_per_slot(fl.config, fl.dtype, True)
    entry["kv_bytes_per_session_bf16"] = SlotKV.bytes_per_slot(fl.config, fl.dtype, False)
    ls = FastLockstep(fl, num_slots=n_slots + 1, max_rows=n_slots, sampling=SamplingConfig(), kv_fp8=True)
    fill_rings_random(ls)
    buckets = sorted(set(args.batch_sizes + [1, 2, 4, 16, 96, n_slots]))
    buckets = [b for b in buckets if b <= n_slots]
    t0 = time.time()
    entry["attention_tuning"] = tune_attention(fl, ls.kv, buckets)
    entry["attention_tuning_s"] = round(time.time() - t0, 1)
    log(f"   attention tuning ({entry['attention_tuning_s']}s): {entry['attention_tuning']}")
    gl = GraphedLockstep(ls, buckets=buckets)
    t0 = time.time()
    torch.cuda.reset_peak_memory_stats()
    gl.capture()
    entry["capture_s"] = round(time.time() - t0, 1)
    entry["buckets"] = list(gl.buckets)
    log(f"   captured {len(gl.buckets)} buckets in {entry['capture_s']}s")
    sizes = sorted({b for b in args.batch_sizes if b <= n_slots} | {n_slots})
    fills = {"fresh": 16, "30s": 375, "full": fl.config.context + 1}
    entry["ours"] = time_ours(gl, sizes, fills, args.warmup, args.ticks)
    entry["ours_memory_GiB"] = round(torch.cuda.max_memory_allocated() / GiB, 2)
    entry["max_sessions_memory"] = n_slots
    entry["ratio_ours_over_reference"] = {
        B: {f: round(o[f]["median"] / entry["reference"][B]["median"], 3) for f in o}
        for B, o in entry["ours"].items()
        if B in entry["reference"] and "median" in entry["reference"][B]
    }
    save(results, args.out)
    entry["profile_eager"] = [profile_eager_step(ls, 1, 16), profile_eager_step(ls, 128, fills["full"])]
    log(f"   profile: {json.dumps(entry['profile_eager'])[:1500]}")
    save(results, args.out)
    if dep_q == 16:
        mimi = build_mimi()
        results["mimi_eager"] = time_mimi(mimi, [1, 128], max(10, args.ticks // 3))
        gm = GraphedMimi(mimi, n_slots + 1)
        t0 = time.time()
        gm.capture()
        results["mimi_graphed_capture_s"] = round(time.time() - t0, 1)
        results["mimi_graphed_equals_eager"] = check_graphed_mimi(gm)
        log(f"   graphed mimi == eager: {results['mimi_graphed_equals_eager']}")
        results["mimi_graphed"] = time_graphed_mimi(gm, sorted({1, 64, 128, n_slots}), args.ticks)
        save(results, args.out)
        rt = {}
        for B in sorted({128, n_slots}):
            for fname in ("30s", "full"):
                rt[f"B{B}_{fname}"] = realtime_ticks(gl, gm, B, fills[fname], args.ticks)
                log(f"   realtime B={B} {fname}: {rt[f'B{B}_{fname}']}")
        if n_slots > 128:  # a session joins while 128 run: its prefill passes fill the spare time of each tick
            passes = prefill_steps_within(
                budget_ms=75.0,
                live_tick_ms=rt["B128_full"]["p99"],
                prefill_step_ms=entry["ours"][1]["fresh"]["p99"],
                pending=82,
            )
            results["join_prefill"] = {"passes_per_tick": passes, "budget_ms": 75.0}
            if passes:
                key = f"B128_full_with_join_prefill{passes}"
                rt[key] = realtime_ticks(gl, gm, 128, fills["full"], args.ticks, passes)
                results["join_prefill"]["ticks_for_82_passes"] = -(-82 // passes)
                log(f"   realtime B=128 full + {passes} prefill passes/tick: {rt[key]}")
        results["realtime"] = rt
        largest = [int(k.split("_")[0][1:]) for k, v in rt.items() if v["realtime"] and k.endswith("_full")]
        results["largest_realtime_sessions_full_context"] = max(largest) if largest else 0
        del gm, mimi
    del gl, ls, fl, lm
    free_memory()
    save(results, args.out)

