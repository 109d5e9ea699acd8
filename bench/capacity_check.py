"""Doctor's session estimate beside what the lockstep engine admits, on the GPU it would serve from.

``python -m inference doctor`` estimates, from a checkpoint's shape and a card's memory, how many sessions the
lockstep engine holds at full context and at the call-length mix, and the ``PARLEY_*`` settings for it. This
script builds the 7B PersonaPlex shape with random bf16 weights on the GPU, then the engine's fast backend
(``FastBackend``: fp8 KV, CUDA graphs of every bucket, graphed Mimi) twice, with the settings doctor prints:

- **full context**: contiguous rings for doctor's full-context sessions. The engine admits its slots if it
  warms up; what memory is still free after warm-up (less ``--margin-gib`` for the run's own allocations)
  would have held more full contexts: engine = slots + that. An out-of-memory warm-up retries 5 % fewer.
- **call mix**: paged KV (pages of 128 frames) with doctor's slots and pool. What the engine holds is
  read from its own admission: ``FastBackend.admissible_sessions`` and its page pool, driven through the churn
  of ``bench/lockstep/paged.py`` (callers always waiting, 3-minute exponential mix capped at 10 minutes, from
  the steady state) for ``--ticks`` ticks per seed, without model steps (admission reads only the calls'
  positions, so a long replay is cheap). The free memory left after warm-up is reported beside it, with the
  population the engine's ``mix_population`` gives for a pool that also took it.

Runs with only torch, transformers and safetensors installed (no tokenizer, no checkpoint on disk), in about
3-5 minutes on an H200:
    PYTHONPATH=$PWD python bench/capacity_check.py            # capacity-check-<gpu>-<commit>.json
(``--out DIR_OR_FILE`` puts the result elsewhere, e.g. ``$OUT`` on the device machine, with BENCH_COMMIT set.)
``--tiny`` runs the same on the CPU with the tiny PersonaPlex test checkpoint (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import result_path, write_result  # noqa: E402
from inference.checkpoints.capacity import (  # noqa: E402
    CALL_CAP_S,
    FRAMES_PER_S,
    GRAPH_RESERVE_GIB,
    MIMI_STATE_BYTES_PER_SLOT,
    PAGE_FRAMES,
    CallMix,
    GiB,
    lm_parameters,
    lockstep_plan,
    replay_mix,
)
from inference.engines.lockstep_fast_backend import FastBackend, KVPaging  # noqa: E402
from inference.models.moshi.config import LMConfig  # noqa: E402
from inference.models.moshi.fast.kv import SlotKV  # noqa: E402
from inference.models.moshi.fast.pages import mix_population  # noqa: E402
from inference.models.moshi.gen import SamplingConfig  # noqa: E402

TINY = Path(__file__).resolve().parents[1] / "tests" / "data" / "personaplex" / "ckpt"


def log(*args) -> None:
    print(*args, flush=True)


def random_lm(config: LMConfig, device: str, seed: int = 0):
    """Parley's MoshiLM at ``config`` with random bf16 weights made on ``device`` (norm gains 1)."""
    from inference.models.moshi.lm import MoshiLM
    from inference.models.moshi.loading import load_lm_state

    with torch.device("meta"):
        lm = MoshiLM(config)
    g = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    state = {}
    for name, meta in lm.state_dict().items():
        floating = meta.dtype.is_floating_point
        t = torch.empty(meta.shape, device=device, dtype=dtype if floating else meta.dtype)
        if not floating:
            t.zero_()
        elif "norm" in name or name.endswith("alpha"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=g)
        state[name] = t
    load_lm_state(lm, state, source="random", allow_widen=False)
    return lm.eval().requires_grad_(False)


def free_device_bytes() -> int:
    """Memory a new allocation could still take: the card's free memory plus what torch's cache holds unused."""
    gc.collect()
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


class BackendTarget:
    """The engine's admission on its own page pool: slots opened as ``LockstepEngine.open_slot`` opens them
    (``reset_slot`` + ``claim_kv``), aged by ``set_passes`` (the pages a pass would take), closed by
    ``release_kv``, asked ``admissible_sessions()`` (``PagePool.admissible`` over the live slots' positions)."""

    def __init__(self, backend: FastBackend):
        self.backend, self.lockstep = backend, backend.lockstep
        self.pages = self.lockstep.kv.pages
        self.live: set[int] = set()

    def open(self, slot: int, age: int) -> None:
        self.backend.reset_slot(slot)
        if not self.backend.claim_kv(slot):
            raise RuntimeError("admission let in a call the pool has no page for")
        if age:
            self.lockstep.set_passes([slot], [age])
        self.live.add(slot)

    def advance(self, slots: list[int]) -> None:
        if slots:
            self.lockstep.set_passes(slots, [self.lockstep.passes[s] + 1 for s in slots])

    def close(self, slot: int) -> None:
        self.backend.release_kv(slot)
        self.live.discard(slot)

    def admissible(self, new_positions: int) -> int:
        if new_positions == 0:
            count = self.backend.admissible_sessions()
            return 1 << 30 if count is None else count
        window = self.pages.window  # a call found in progress: the same rule, starting at its age
        live = [(s, min(self.lockstep.passes[s], window)) for s in self.live]
        return self.pages.admissible(
            live, self.backend.paging.mean_call_frames, new_positions=min(new_positions, window)
        )


def build_backend(lm, codec, slots: int, paging: KVPaging | None) -> FastBackend:
    backend = FastBackend(
        lm, codec, slots, SamplingConfig(), kv_fp8=next(lm.parameters()).device.type == "cuda", paging=paging
    )
    backend.warmup()
    return backend


def full_context(lm, codec, plan, margin_gib: float, per_session: int) -> dict:
    slots, tries = plan.full_context_sessions, []
    for _ in range(4):
        try:
            t0 = time.time()
            backend = build_backend(lm, codec, slots, None)
        except torch.cuda.OutOfMemoryError as exc:
            tries.append({"slots": slots, "fits": False, "error": str(exc).split("\n")[0][:200]})
            log(f"   full context: {slots} slots do not fit; trying {int(slots * 0.95)}")
            gc.collect()
            torch.cuda.empty_cache()
            slots = int(slots * 0.95)
            continue
        admitted = backend.capacity().full_context
        free = free_device_bytes()
        more = max(int((free - margin_gib * GiB) // (per_session + MIMI_STATE_BYTES_PER_SLOT)), 0) if free else 0
        tries.append({"slots": slots, "fits": True, "warmup_s": round(time.time() - t0, 1)})
        out = {"engine_admits": admitted, "free_after_warmup_gib": round(free / GiB, 2),
               "more_full_contexts_in_free_memory": more, "engine_full_context": admitted + more, "tries": tries}  # fmt: skip
        del backend
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return out
    return {"engine_full_context": None, "tries": tries}


def call_mix(lm, codec, plan, args, per_session: int) -> dict:
    slots = int(plan.settings["PARLEY_SLOTS"])
    paging = KVPaging(PAGE_FRAMES, float(plan.settings["PARLEY_KV_POOL_GB"]), round(args.mean_call_s * FRAMES_PER_S))
    t0 = time.time()
    backend = build_backend(lm, codec, slots, paging)
    warm_s = round(time.time() - t0, 1)
    cap = backend.capacity()
    pages = backend.lockstep.kv.pages
    free = free_device_bytes()
    per_page = per_session * PAGE_FRAMES / lm.config.kv_window
    extra_pages = max(int((free - args.margin_gib * GiB) // per_page), 0) if free else 0
    with_free = mix_population(pages.usable_pages + extra_pages, PAGE_FRAMES, pages.window, paging.mean_call_frames,
                               CALL_CAP_S * FRAMES_PER_S, limit=slots)  # fmt: skip
    replays = []
    for seed in range(1, args.seeds + 1):
        t1 = time.time()
        replay = replay_mix(BackendTarget(backend), CallMix(args.mean_call_s, seed=seed), slots, args.ticks)
        replays.append(replay | {"seed": seed, "replay_s": round(time.time() - t1, 1)})
        log(f"   call mix, seed {seed}: {replays[-1]}")
    held = round(sum(r["mean"] for r in replays) / len(replays), 1)
    out = {"slots": slots, "pool_gb": paging.pool_gb, "pool_pages": pages.usable_pages, "warmup_s": warm_s,
           "engine_capacity": dataclasses.asdict(cap), "free_after_warmup_gib": round(free / GiB, 2),
           "engine_mix_population_with_free_memory": with_free, "replays": replays,
           "engine_holds_mean": held, "sessions_whose_ring_shrank": pages.capped_slots}  # fmt: skip
    del backend
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu-gib", type=float, default=None, help="the card's memory, GiB (default: as CUDA reports)")
    p.add_argument("--mean-call-s", type=float, default=180.0)
    p.add_argument("--seeds", type=int, default=3, help="call-mix replays (different draws)")
    p.add_argument("--ticks", type=int, default=6000, help="ticks per replay (80 ms each: 6000 = 8 minutes of calls)")
    p.add_argument("--margin-gib", type=float, default=1.0, help="free memory a serving engine keeps for itself")
    p.add_argument("--tiny", action="store_true", help="the tiny test checkpoint on the CPU (smoke test)")
    p.add_argument("--call-mix-only", action="store_true", help="skip the full-context engine (its 30 s warm-up)")
    p.add_argument("--out", default=None, help="a file, or a directory for the named result")
    args = p.parse_args()
    device = "cpu" if args.tiny else "cuda"
    out = result_path("capacity-check-tiny" if args.tiny else "capacity-check", gpu=not args.tiny, out=args.out)
    if args.tiny:
        from inference.models.moshi.config import read_checkpoint_dir

        config = read_checkpoint_dir(TINY).lm
        # a "card" that leaves room for about 8 sessions beside the tiny weights and the graph reserve
        gpu_gib = args.gpu_gib or GRAPH_RESERVE_GIB + 2 * lm_parameters(config) / GiB + 0.13
    else:
        config = LMConfig(dep_q=16)  # PersonaPlex 7B: Moshi's temporal transformer, depformer over 16 streams
        gpu_gib = args.gpu_gib or torch.cuda.get_device_properties(0).total_memory / GiB
    results: dict = {"command": "PYTHONPATH=$PWD python " + " ".join(sys.argv), "device": device,
                     "torch": torch.__version__, "gpu_gib": round(gpu_gib, 2), "shape": "tiny" if args.tiny else
                     "PersonaPlex 7B (dep_q 16)", "mean_call_s": args.mean_call_s}  # fmt: skip
    if device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    weight_bytes = 2 * lm_parameters(config)
    plan = lockstep_plan(config, gpu_gib, mean_call_s=args.mean_call_s, kv_fp8=True, weight_bytes=weight_bytes)
    per_session = SlotKV.bytes_per_slot(config, torch.bfloat16, True)
    results["doctor"] = {"full_context": plan.full_context_sessions, "call_mix": plan.mix_sessions,
                         "settings": plan.settings, "kv_bytes_per_session": per_session}  # fmt: skip
    log(f"doctor: {results['doctor']}")
    t0 = time.time()
    lm = random_lm(config, device)
    from inference.models.moshi.mimi import MimiCodec, MimiConfig

    codec = MimiCodec(MimiConfig.kyutai_default()).to(device).eval()
    results["build_s"] = round(time.time() - t0, 1)
    results["parameters"] = sum(t.numel() for t in lm.parameters())
    if args.call_mix_only:
        results["full_context"] = {"engine_full_context": None, "skipped": "--call-mix-only"}
    else:
        results["full_context"] = full_context(lm, codec, plan, args.margin_gib, per_session)
        write_result(results, out.stem, gpu=not args.tiny, out=out)
        log(f"full context: {results['full_context']}")
    results["call_mix"] = call_mix(lm, codec, plan, args, per_session)
    engine_full = results["full_context"]["engine_full_context"]
    engine_mix = results["call_mix"]["engine_holds_mean"]
    results["ratios_doctor_over_engine"] = {
        "full_context": round(plan.full_context_sessions / engine_full, 4) if engine_full else None,
        "call_mix": round(plan.mix_sessions / engine_mix, 4) if engine_mix else None,
    }
    if torch.cuda.is_available():
        results["peak_gib"] = round(torch.cuda.max_memory_allocated() / GiB, 2)
    path = write_result(results, out.stem, gpu=not args.tiny, out=out)
    if os.environ.get("OUT") and not args.out:
        write_result(results, out.stem, gpu=not args.tiny, out=Path(os.environ["OUT"]) / out.name)
    log("")
    log(f"{'':14}{'doctor':>8}{'engine':>9}{'ratio':>8}")
    ratios = results["ratios_doctor_over_engine"]
    log(f"{'full context':14}{plan.full_context_sessions:>8}{engine_full or '-':>9}{ratios['full_context'] or '-':>8}")
    log(f"{'call mix':14}{plan.mix_sessions:>8}{engine_mix:>9}{ratios['call_mix'] or '-':>8}")
    log(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
