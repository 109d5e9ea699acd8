"""The fast path against the reference moshi 0.2.13 on one H200 (issue 13), PersonaPlex shape (dep_q 16), random bf16 weights shared by both paths.

Sections, in order (each one's failure is recorded in the results and the next one still runs):

1. ``reference``: moshi 0.2.13 ``LMGen`` at B=1 (the per-caller floor), then its capacity measured: growing
   batch sizes until one fails to allocate.
2. ``kv_format``: fp8 vs bf16 KV on the same weights, greedy, 8 sessions x 500 frames (``kv_format``).
3. ``kv_capacity``: for each KV format, the sessions that fit at full context and the bare step's time at
   B = 1, 64 and that maximum, full context.
4. ``serving``: ``LockstepEngine`` (fast backend, fp8 KV) under ``EngineWorker`` with 128 in-process callers at
   full context: served / engine-only / bare tick times (``serving``), and B=1 of the same graphs.
5. ``graph_equals_eager``: greedy tokens of the graphed step == the eager step, fp8 and bf16 KV, B = 1 and 8.

Run order: the reference's B=1, 4 (the issue's first goal), 2, 3, 5, then the reference's capacity (last: an
allocation failure can leave the allocator fragmented).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
import time
import traceback
from pathlib import Path

import torch

from bench.lockstep.codec import build_mimi
from bench.lockstep.common import GiB, free_memory, log, save
from bench.lockstep.fast import check_graph_equals_eager, fill_rings_random, max_slots, time_ours
from bench.lockstep.kv_format import compare_kv_formats, forced_against
from bench.lockstep.reference import build_reference, native_from_reference, reference_capacity, time_reference
from bench.lockstep.serving import serving_report
from inference.models.moshi.config import LMConfig
from inference.models.moshi.fast.graphs import GraphedLockstep
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.model import FastLM
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.fast.tuning import tune_attention
from inference.models.moshi.gen import SamplingConfig

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "personaplex" / "ckpt"


def _section(results: dict, name: str, out: str | None, fn) -> None:
    t0 = time.time()
    try:
        results[name] = fn()
    except Exception:  # noqa: BLE001 - keep the other sections' numbers; the traceback goes into the results
        results[name] = {"error": traceback.format_exc()}
        log(traceback.format_exc())
        free_memory()
    if isinstance(results[name], dict):
        results[name]["section_s"] = round(time.time() - t0, 1)
    save(results, out)


def kv_capacity(fl: FastLM, reserve_gib: float, cap: int, ticks: int) -> dict:
    """Per KV format: sessions that fit at full context and bare step times at B = 1, 64, max (full context)."""
    out = {}
    fill = fl.config.context + 1
    for name, fp8 in (("bf16", False), ("fp8", True)):
        free_memory()
        n = max_slots(fl, kv_fp8=fp8, reserve_GiB=reserve_gib, cap=cap)
        ls = FastLockstep(fl, num_slots=n + 1, max_rows=n, sampling=SamplingConfig(), kv_fp8=fp8)
        fill_rings_random(ls)
        buckets = sorted({1, 64, n})
        tuning = tune_attention(fl, ls.kv, buckets)
        gl = GraphedLockstep(ls, buckets=buckets)
        gl.capture()
        timing = time_ours(gl, buckets, {"full": fill}, 5, ticks)
        out[name] = {
            "max_sessions_full_context": n,
            "kv_bytes_per_session": SlotKV.bytes_per_slot(fl.config, fl.dtype, fp8),
            "reserve_GiB": reserve_gib,
            "step_ms_full_context": timing,
            "attention_tuning": tuning,
        }
        log(f"   kv {name}: {n} sessions fit; {json.dumps(timing)}")
        del gl, ls
        fl.attention_launch.clear()
        free_memory()
    return out


def kv_against_fp32(lm, sessions: int, frames: int) -> dict:
    """The same weights in fp32 as the teacher; bf16 weights with bf16 KV, bf16 with fp8 KV, fp32 with fp8 KV
    forced on its tokens: puts the KV format's error next to the error of serving in bf16 at all."""
    import copy

    lm32 = copy.deepcopy(lm).float()
    g = torch.Generator().manual_seed(1)
    user_codes = torch.randint(0, lm.config.card, (sessions, frames, 8), generator=g)
    fl32, fl16 = FastLM(lm32), FastLM(lm)
    others = {
        "bf16_weights_bf16_kv": (fl16, False),
        "bf16_weights_fp8_kv": (fl16, True),
        "fp32_weights_fp8_kv": (fl32, True),
    }
    out = forced_against(fl32, others, user_codes)
    log(f"   {json.dumps(out)}")
    del fl32, lm32
    free_memory()
    return out | {"sessions": sessions, "frames": frames}


def checkpoint_dir(tmp: Path) -> Path:
    """A checkpoint directory with the 7B PersonaPlex config: the engine reads its shapes and sampling settings
    from it; the weights come in memory (``LockstepEngine.warmup(loaded=...)``), the tokenizer is the tiny one
    (text ids beyond its vocabulary detokenise to '', which costs the same host work)."""
    cfg = dataclasses.asdict(LMConfig(dep_q=16))
    cfg.pop("extra", None)
    cfg.update(
        moshi_name="model.safetensors",
        tokenizer_name="tokenizer.model",
        lm_gen_config={"temp": 0.8, "temp_text": 0.7, "top_k": 250, "top_k_text": 25},
    )
    (tmp / "config.json").write_text(json.dumps(cfg))
    (tmp / "model.safetensors").write_bytes(b"")  # never read: the weights are handed in
    (tmp / "tokenizer.model").write_bytes((TINY / "tokenizer.model").read_bytes())
    return tmp


def serving(lm, sessions: int, ticks: int, engine_ticks: int) -> dict:
    import sentencepiece as spm

    from inference.engines.lockstep import LockstepEngine

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint_dir(Path(tmp))
        engine = LockstepEngine(ckpt, sessions, device="cuda", dtype="bfloat16", kv_fp8=True)
        tokenizer = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
        t0 = time.time()
        engine.warmup(loaded=(lm, build_mimi(), tokenizer))
        out = {"warmup_s": round(time.time() - t0, 1), "kv": "fp8", "buckets": sorted(engine.backend.graphed.graphs)}
        log(f"   engine warm-up {out['warmup_s']} s, buckets {out['buckets']}")
        out["full_context"] = serving_report(
            engine, sessions, lm.config.context + 1, ticks, engine_ticks, fill_rings_random
        )
        gl = engine.backend.graphed
        out["b1_graphed_step"] = time_ours(gl, [1], {"fresh": 16, "full": lm.config.context + 1}, 10, 200)[1]
        log(f"   B=1 graphed step: {out['b1_graphed_step']}")
        del engine
    free_memory()
    return out


def run_against_reference(args, results: dict) -> None:
    out = args.out
    log("== reference (moshi 0.2.13), dep_q 16, random bf16 weights")
    lm_ref = build_reference(16)
    results["params"] = sum(p.numel() for p in lm_ref.parameters())
    b1 = functools.partial(time_reference, lm_ref, [1], args.warmup, args.ticks_b1)
    if "ref" in args.sections:
        _section(results, "reference_b1", out, b1)
    # the native model aliases the reference's temporal weights (only the depformer stacks are copied, 2.6 GB),
    # so the reference stays alive for its capacity run, which goes last: an allocation failure there may leave
    # the allocator fragmented, and nothing runs after it
    lm = native_from_reference(lm_ref, 16)
    free_memory()
    results["held_by_reference_copies_GiB"] = round(
        sum(p.numel() * p.element_size() for n, p in lm_ref.named_parameters() if "depformer" in n) / GiB, 2
    )
    if "serving" in args.sections:  # first: the first goal, and it needs the most memory
        log("== serving path: LockstepEngine + EngineWorker, fp8 KV")
        _section(results, "serving", out, lambda: serving(lm, args.sessions, args.serve_ticks, args.engine_ticks))
    fl = FastLM(lm)
    if "kv" in args.sections:
        log("== KV format: bf16 vs fp8, greedy, 8 sessions x 500 frames")
        _section(results, "kv_format_7b", out, lambda: compare_kv_formats(fl, 8, args.kv_frames))
        _section(results, "kv_capacity", out, lambda: kv_capacity(fl, args.reserve_gib, args.max_slots, 30))
    if "kvfloor" in args.sections:
        log("== KV format against the serving dtype's own error: fp32 teacher, bf16 / fp8 KV forced on its tokens")
        _section(results, "kv_against_fp32_7b", out, lambda: kv_against_fp32(lm, 8, args.kv_frames))
    if "equal" in args.sections:
        log("== greedy graph == eager, both KV formats")
        _section(
            results,
            "graph_equals_eager",
            out,
            lambda: {
                name: check_graph_equals_eager(fl, [1, 8], args.check_frames, fp8)
                for name, fp8 in (("fp8", True), ("bf16", False))
            },
        )
    if "capacity" in args.sections:
        fl = lm = None  # the native copies (depformer stacks, stacked embeddings) go before the reference's run
        free_memory()
        log("== reference capacity: growing batch sizes until allocation fails")
        capacity = functools.partial(reference_capacity, lm_ref, args.ref_start, args.ref_step, args.ref_limit)
        _section(results, "reference_capacity", out, capacity)
    ref_b1 = results.get("reference_b1", {}).get(1, {}).get("median")
    ours_b1 = results.get("serving", {}).get("b1_graphed_step", {}).get("fresh", {}).get("median")
    if ref_b1 and ours_b1:
        results["b1_ratio_ours_over_reference"] = round(ours_b1 / ref_b1, 3)
    results["peak_GiB"] = round(torch.cuda.max_memory_allocated() / GiB, 2)
