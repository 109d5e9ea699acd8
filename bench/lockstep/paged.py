"""Issue 13, goal 4: paged KV on one H200. How many callers stay real time when calls have a realistic length.

Three measurements, PersonaPlex shape (dep_q 16), fp8 KV, random bf16 weights built natively (no reference
needed):

- ``equal``: greedy tokens with pages of 128 frames scattered over the pool == contiguous rings, 8 slots, half
  of them joining 150 frames late, 400 frames, graphed (one attention launch for both, so the same blocks are
  summed in the same order). Wrapping past the window is checked on the tiny checkpoint (CPU and GPU tests).
- ``page_cost``: the bare graphed step at B = 128, full context, contiguous vs paged: what the page table
  indirection costs.
- ``churn``: ``LockstepEngine`` (fast backend, Mimi, the joiners' prefill riding along in the live pass) with a
  paged pool sized to the card's free memory, callers arriving faster than they can be served (always one
  waiting), admitted by ``engine.admissible_sessions()``, each staying for a call length drawn from the stated
  mix: exponential with mean 3 minutes, capped at 10. The run starts from the mix's steady state (sessions
  already in progress, ages drawn length-biased), then runs ``ticks`` ticks back to back; every tick's wall time
  covers departures (``close_slot``), admissions (``open_slot``) and ``engine.step``. Reported: concurrent
  sessions per tick, tick median / p99 / max, late ticks (> 80 ms), pages in use, sessions whose ring had to
  shrink, and the same memory's capacity as contiguous rings. The loop takes the engine's count itself; how the
  service's pool and worker pass that count on is tested on the CPU (``test_pool_admission``,
  ``test_paged_service``).
"""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path

import torch

from bench.lockstep.codec import build_mimi
from bench.lockstep.common import FRAME_MS, GiB, free_memory, log, stats
from bench.lockstep.fast import fill_rings_random, time_ours
from bench.lockstep.serving import FRAME, caller_audio
from inference.checkpoints.capacity import CallMix
from inference.engines.base import SlotConfig, SlotInput
from inference.models.moshi.config import LMConfig
from inference.models.moshi.fast import ops
from inference.models.moshi.fast.graphs import GraphedLockstep
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.model import FastLM
from inference.models.moshi.fast.pages import ADMIT_Z
from inference.models.moshi.fast.session import live_forced
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.fast.tuning import tune_attention
from inference.models.moshi.gen import SamplingConfig
from inference.models.moshi.lm import MoshiLM
from inference.models.moshi.loading import load_lm_state

FRAMES_PER_S = 1000.0 / FRAME_MS


def build_native_random(dep_q: int = 16, seed: int = 0, context: int | None = None) -> MoshiLM:
    """Parley's MoshiLM at the published shape with random bf16 weights made on the GPU (norm gains 1); ``context``
    in frames, the published one by default (``PARLEY_LOCKSTEP_CONTEXT`` serves a shorter one)."""
    with torch.device("meta"):
        lm = MoshiLM(LMConfig(dep_q=dep_q, **({"context": context} if context else {})))
    g = torch.Generator(device="cuda").manual_seed(seed)
    state = {}
    for name, meta in lm.state_dict().items():
        t = torch.empty(meta.shape, device="cuda", dtype=torch.bfloat16 if meta.dtype.is_floating_point else meta.dtype)
        if not meta.dtype.is_floating_point:
            t.zero_()
        elif "norm" in name or name.endswith("alpha"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=g)
        state[name] = t
    load_lm_state(lm, state, source="random", allow_widen=False)
    return lm.eval().requires_grad_(False)


# ---- greedy equality and the page table's cost ---------------------------------------------------------------


def paged_equals_contiguous(fl: FastLM, B: int, frames: int, page: int) -> dict:
    fl.attention_launch.clear()
    launch = ops.AttentionLaunch(splits=4, block_n=64)
    fl.attention_launch.update({B // 2: launch, B: launch})
    g = torch.Generator(device="cuda").manual_seed(11)
    codes = torch.randint(0, 2048, (frames, B, 8), device="cuda", generator=g)
    greedy = SamplingConfig(use_sampling=False)
    runs = []
    for page_size in (None, page):
        ls = FastLockstep(fl, num_slots=B, max_rows=B, sampling=greedy, kv_fp8=True, kv_page_size=page_size)
        gl = GraphedLockstep(ls, buckets=[B // 2, B])
        gl.capture()
        out = []
        for t in range(frames):
            live = list(range(B)) if t >= 150 else list(range(0, B, 2))  # odd slots join late: pages interleave
            forced, mask = live_forced(fl.config, codes[t, live])
            out.append(gl.step(torch.tensor(live, device="cuda"), forced, mask, slots=live)[0].cpu())
        runs.append(out)
        del gl, ls
        free_memory()
    fl.attention_launch.clear()
    mismatched = sum(int((a != b).any(dim=1).sum()) for a, b in zip(*runs, strict=True))
    out = {"B": B, "frames": frames, "page": page, "launch": "splits 4, block 64 (both)"}
    return out | {"mismatched_row_frames": mismatched, "equal": mismatched == 0}


def page_cost(fl: FastLM, B: int, page: int, ticks: int) -> dict:
    """Bare graphed step at full context, B rows: contiguous rings vs pages (pages handed out in turn)."""
    fill = fl.config.context + 1
    out = {}
    for name, page_size in (("contiguous", None), ("paged", page)):
        free_memory()
        ls = FastLockstep(fl, num_slots=B, max_rows=B, sampling=SamplingConfig(), kv_fp8=True, kv_page_size=page_size)
        ls.set_passes(range(B), [fill] * B)  # every slot holds its full window (interleaved pages when paged)
        fill_rings_random(ls)
        tuning = tune_attention(fl, ls.kv, [B])
        gl = GraphedLockstep(ls, buckets=[B])
        gl.capture()
        out[name] = time_ours(gl, [B], {"full": fill}, 5, ticks)[B]["full"] | {"tuning": tuning.get(B)}
        log(f"   page cost, {name}: {out[name]}")
        del gl, ls
        fl.attention_launch.clear()
    out["paged_over_contiguous_median"] = round(out["paged"]["median"] / out["contiguous"]["median"], 4)
    return out


# ---- callers coming and going ------------------------------------------------------------------------------


def pool_gb_for(lm: MoshiLM, slots: int, reserve_gib: float) -> float:
    """The paged pool: the card's free memory less the codec's per-slot streams and a reserve for graphs."""
    free_memory()
    free = torch.cuda.mem_get_info()[0]
    mimi_state = 16.5e6 * slots  # Mimi streaming state, ~16.4 MB per slot (measured on the CPU build)
    return round((free - mimi_state - reserve_gib * GiB) / 1e9, 2)


def churn(lm: MoshiLM, slots: int, page: int, reserve_gib: float, ticks: int, warm: int) -> dict:
    import sentencepiece as spm

    from bench.lockstep.against_reference import checkpoint_dir
    from inference.engines.lockstep import LockstepEngine
    from inference.engines.lockstep_fast_backend import KVPaging

    pool_gb = pool_gb_for(lm, slots, reserve_gib)
    mix = CallMix(seed=1)
    paging = KVPaging(page_frames=page, pool_gb=pool_gb, mean_call_frames=round(mix.mean_s * FRAMES_PER_S))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint_dir(Path(tmp))
        engine = LockstepEngine(ckpt, slots, device="cuda", dtype="bfloat16", kv_fp8=True, kv_paging=paging)
        tokenizer = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
        t0 = time.time()
        engine.warmup(loaded=(lm, build_mimi(), tokenizer))
        warm_s = round(time.time() - t0, 1)
        fill_rings_random(engine.backend.lockstep)
        pages = engine.backend.lockstep.kv.pages
        out = {
            "slots": slots,
            "page_frames": page,
            "pool_gb": pool_gb,
            "pool_pages": pages.usable_pages,
            "bytes_per_page": engine.backend.lockstep.kv.bytes_per_page(),
            "contiguous_capacity_same_memory": pages.usable_pages // pages.pages_per_slot,
            "admission": f"expected pages over the calls' remaining life + {ADMIT_Z:g} sd within the pool (mean call 180 s)",
            "call_mix": {"mean_s": mix.mean_s, "cap_s": mix.cap_s, "distribution": "exponential, capped"},
            "mean_context_frames_in_progress": round(mix.mean_context_frames(pages.window), 1),
            "warmup_s": warm_s,
            "buckets": sorted(engine.backend.graphed.graphs),
        }
        log(f"   paged engine: {out}")
        out |= serve_call_mix(engine, mix, paging.mean_call_frames, ticks, warm)
        log(
            f"   churn: ticks {out['ticks']}, sessions {out['concurrent_sessions']}, shrank {out['sessions_whose_ring_shrank']}"
        )
        del engine
    free_memory()
    return out


def serve_call_mix(engine, mix: CallMix, mean_call_frames: int, ticks: int, warm: int) -> dict:
    """Callers always waiting, admitted by the engine's memory, staying for ``mix`` call lengths; from the
    mix's steady state. Every tick's time covers closes, opens and ``engine.step``."""
    ls = engine.backend.lockstep
    pages = ls.kv.pages
    window = pages.window
    slots = engine.num_slots
    out: dict = {}
    free_slots = list(range(slots - 1, -1, -1))
    left: dict[int, int] = {}  # slot -> frames the call still has

    def admit(age: int, frames_left: int) -> None:
        s = free_slots.pop()
        engine.open_slot(s, SlotConfig())
        if age:
            ls.set_passes([s], [age])  # a call in progress: its context so far (random ring contents)
        left[s] = frames_left

    # the steady state: calls in progress, admitted as long as admission takes them
    while free_slots:
        age, frames_left = mix.in_progress()
        live = [(s, min(ls.passes[s], window)) for s in left]
        if pages.admissible(live, mean_call_frames, new_positions=min(age, window)) < 1:
            break
        admit(age, frames_left)
    out["initial_sessions"] = len(left)
    audio = [caller_audio(2000 + s, 8) for s in range(slots)]
    records = []
    admitted = departed = 0
    shrunk0 = pages.capped_slots
    for i in range(warm + ticks):  # warm: past the first minute's joins and the initial prefill
        t = time.perf_counter()
        for s in [s for s, n in left.items() if n <= 0]:
            engine.close_slot(s)
            del left[s]
            free_slots.append(s)
            departed += i >= warm
        room = engine.admissible_sessions()
        room = len(free_slots) if room is None else min(room, len(free_slots))
        for _ in range(room):  # the queue never empties: every free place is taken at once
            admit(0, mix.length())
            admitted += i >= warm
        inputs = {
            s: SlotInput(audio=audio[s][(i % 8) * FRAME : (i % 8 + 1) * FRAME]) for s in left if engine._slots[s].live
        }
        engine.step(inputs)
        ms = (time.perf_counter() - t) * 1e3
        for s in left:
            left[s] -= 1
        if i >= warm:
            records.append((ms, len(left), len(inputs), pages.usable_pages - pages.free_pages))
    times = [r[0] for r in records]
    sessions = [r[1] for r in records]
    out["ticks"] = stats(times) | {
        "count": len(times),
        "late_over_80ms": sum(ms > FRAME_MS for ms in times),
        "realtime": stats(times)["p99"] <= FRAME_MS,
    }
    out["concurrent_sessions"] = {
        "min": min(sessions),
        "mean": round(sum(sessions) / len(sessions), 1),
        "max": max(sessions),
        "live_not_prefilling_mean": round(sum(r[2] for r in records) / len(records), 1),
    }
    out["pages_in_use"] = {"mean": round(sum(r[3] for r in records) / len(records)), "max": max(r[3] for r in records)}
    out["admitted_during_window"] = admitted
    out["departed_during_window"] = departed
    out["sessions_whose_ring_shrank"] = pages.capped_slots - shrunk0
    out["timeline_every_25_ticks"] = [
        {"tick": k, "ms": round(records[k][0], 1), "sessions": records[k][1], "pages": records[k][3]}
        for k in range(0, len(records), 25)
    ]
    return out


def run_paged(args, results: dict) -> None:
    from bench.lockstep.against_reference import _section

    log("== paged KV: native random bf16 weights, PersonaPlex shape")
    lm = build_native_random(16)
    results["params"] = sum(p.numel() for p in lm.parameters())
    results["window_frames"] = lm.config.kv_window
    results["bytes_full_session_fp8"] = SlotKV.bytes_per_slot(lm.config, torch.bfloat16, True)
    fl = FastLM(lm)
    if "equal" in args.sections:
        _section(
            results,
            "paged_equals_contiguous",
            args.out,
            functools.partial(paged_equals_contiguous, fl, 8, 400, args.page),
        )
    if "cost" in args.sections:
        _section(results, "page_cost", args.out, functools.partial(page_cost, fl, 128, args.page, 60))
    fl = None  # its stacked copies go before the engine builds its own
    free_memory()
    if "churn" in args.sections:
        _section(
            results,
            "churn",
            args.out,
            lambda: churn(lm, args.slots, args.page, args.reserve_gib, args.ticks, 80),
        )
    results["peak_GiB"] = round(torch.cuda.max_memory_allocated() / GiB, 2)
