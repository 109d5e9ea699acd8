"""Where the lockstep service's memory goes as calls come and go: the engine alone, calls opened and closed.

The GPU soaks (``notes/serving-e2e.md``) saw the lockstep service's RSS grow about 0.4 MB for every call that
ended, at the same rate with ``MALLOC_ARENA_MAX=2``, while the unit service levelled off under the same churn. On
the CPU (the tiny checkpoint, fast backend, paged KV) neither the engine nor the service around it keeps anything
per call: the Python heap grew 0.3-1.5 kB a call. This runs the engine as the GPU service builds it (random 7B
weights, fast path, fp8 KV in a paged pool), with ``--slots`` calls held at once and each call ending after an
exponential number of frames and a new one opening in its slot, and samples per calls ended: the process's RSS,
the Python heap (``tracemalloc``, with ``--tracemalloc``: it slows the loop), the CUDA caching allocator's
allocated and reserved bytes, and the pinned host allocator's where torch reports it. A slope of RSS per call
with the Python heap flat points below Python (the CUDA driver, the allocator's mappings); the variants take one
suspect away each: ``--no-prefill-cache`` (every call prefills instead of restoring a cached start) and, through
the environment, ``PYTORCH_CUDA_ALLOC_CONF`` without ``expandable_segments``.

Usage (GPU machine, about 3 minutes each):
    python3 bench/lockstep_churn.py --calls 600 --out $OUT
    python3 bench/lockstep_churn.py --calls 600 --no-prefill-cache --out $OUT
    PYTORCH_CUDA_ALLOC_CONF= python3 bench/lockstep_churn.py --calls 600 --what-suffix plain-alloc --out $OUT
Here: ``.venv/bin/python bench/lockstep_churn.py --tiny --slots 4 --calls 200`` (the tiny checkpoint on the CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # as the GPU service runs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results_io import write_result  # noqa: E402
from bench.serving_gpu_service import TINY_CHECKPOINT, build_lockstep  # noqa: E402
from bench.serving_topology import rss_mb  # noqa: E402
from inference.config import InferenceConfig  # noqa: E402
from inference.engines.base import SlotConfig, SlotInput  # noqa: E402
from inference.engines.prefill_cache import PrefillCache  # noqa: E402


def memory_sample(calls_ended: int, ticks: int, traced: bool) -> dict:
    sample = {"calls_ended": calls_ended, "ticks": ticks, "rss_mb": round(rss_mb([os.getpid()]), 1)}
    if traced:
        sample["python_heap_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
    if torch.cuda.is_available():
        sample["cuda_allocated_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        sample["cuda_reserved_mb"] = round(torch.cuda.memory_reserved() / 2**20, 1)
        host_stats = getattr(torch.cuda, "host_memory_stats", None)  # the pinned host allocator (torch >= 2.5)
        if host_stats is not None:
            sample["cuda_host_allocated_mb"] = round(host_stats().get("allocated_bytes.current", 0) / 2**20, 1)
    return sample


def slope_per_call(samples: list[dict], key: str) -> float | None:
    """Least-squares growth of ``key`` per call ended over the second half of the run (past the warm-up)."""
    half = [s for s in samples[len(samples) // 2 :] if key in s]
    if len(half) < 3:
        return None
    calls = np.array([s["calls_ended"] for s in half], dtype=float)
    values = np.array([s[key] for s in half], dtype=float)
    return round(float(np.polyfit(calls, values, 1)[0]) * 1024, 2)  # kB per call


def build(args, tmp: Path):
    if args.tiny:
        from inference.engines.lockstep import LockstepEngine
        from inference.engines.lockstep_fast_backend import KVPaging

        # the fast backend with paged KV, as on the GPU, at the tiny checkpoint's size
        paging = KVPaging(page_frames=16, pool_gb=0.0003 * args.slots, mean_call_frames=50)
        engine = LockstepEngine(TINY_CHECKPOINT, args.slots, device="cpu", dtype="float32", kv_paging=paging)
        engine.warmup()
        return engine
    config = InferenceConfig.from_env().with_overrides(slots=args.slots, kv_page_frames=128, kv_mean_call_s=180)
    return build_lockstep(config, tmp, args.reserve_gib, tiny=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=600, help="calls to end")
    parser.add_argument("--slots", type=int, default=64, help="calls held at once")
    parser.add_argument("--mean-frames", type=float, default=40.0, help="a call's mean length in 80 ms frames")
    parser.add_argument("--samples", type=int, default=30, help="memory samples over the run")
    parser.add_argument("--tiny", action="store_true", help="the tiny checkpoint on the CPU")
    parser.add_argument("--no-prefill-cache", action="store_true", help="every call prefills its start")
    parser.add_argument("--tracemalloc", action="store_true", help="also sample the Python heap (slower)")
    parser.add_argument("--reserve-gib", type=float, default=7.0)
    parser.add_argument("--what-suffix", default="", help="added to the result's name (e.g. the allocator's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        engine = build(args, Path(tmp))
        if args.no_prefill_cache:
            engine.prefill_cache = PrefillCache(0)
        frame = engine.capabilities.input_chunk_samples
        if args.tracemalloc:
            tracemalloc.start()
        remaining = {}  # slot -> live frames left in its call
        ended = ticks = 0
        every = max(1, args.calls // args.samples)
        samples = [memory_sample(0, 0, args.tracemalloc)]
        t0 = time.monotonic()
        while ended < args.calls:
            for slot in range(args.slots):
                if slot not in remaining:
                    engine.open_slot(slot, SlotConfig())
                    remaining[slot] = 1 + int(rng.exponential(args.mean_frames))
            live = [s for s in remaining if engine.live_at_open(s)]
            audio = (0.05 * rng.standard_normal((len(live), frame))).astype(np.float32)
            engine.step({s: SlotInput(audio=audio[i]) for i, s in enumerate(live)})
            ticks += 1
            for slot in live:
                remaining[slot] -= 1
                if remaining[slot] <= 0:
                    engine.close_slot(slot)
                    del remaining[slot]
                    ended += 1
                    if ended % every == 0:
                        samples.append(memory_sample(ended, ticks, args.tracemalloc))
                        print(samples[-1], flush=True)
        seconds = time.monotonic() - t0
    keys = [k for k in samples[-1] if k not in ("calls_ended", "ticks")]
    result = {
        "engine": "lockstep tiny (CPU)" if args.tiny else "lockstep 7B random bf16, fast path, fp8 KV, paged pool",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.tiny else "cpu",
        "torch": torch.__version__,
        "slots": args.slots,
        "calls_ended": ended,
        "ticks": ticks,
        "seconds": round(seconds, 1),
        "mean_frames": args.mean_frames,
        "prefill_cache": not args.no_prefill_cache,
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "growth_kb_per_call_second_half": {k: slope_per_call(samples, k) for k in keys},
        "samples": samples,
    }
    print({"growth_kb_per_call_second_half": result["growth_kb_per_call_second_half"], "seconds": result["seconds"]})
    what = "lockstep-churn" + ("-tiny" if args.tiny else "") + ("-noprefillcache" if args.no_prefill_cache else "")
    what += f"-{args.what_suffix}" if args.what_suffix else ""
    print(f"wrote {write_result(result, what, gpu=not args.tiny, out=args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
