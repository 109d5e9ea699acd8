"""Lockstep engine on one GPU: the reference moshi 0.2.13 and Parley's fast path, side by side on the same weights.

Two runs live here (the pieces are in ``bench/lockstep/``):

- the default, issue 13's sections (``bench/lockstep/against_reference.py``): the reference's B=1 and its capacity measured
  until allocation fails; fp8 vs bf16 KV on identical weights (divergence, agreement, text-logit KL) with each
  format's capacity and step times; and the serving path itself, ``LockstepEngine`` under ``EngineWorker`` with
  128 in-process callers at full context, against the bare graphed loop;
- ``--paged``: goal 4 of issue 13 (``bench/lockstep/paged.py``): paged == contiguous, the page table's cost,
  and callers coming and going with a stated mix of call lengths through ``LockstepEngine`` on a paged pool;
- ``--legacy``: issue 5's sweep (``bench/lockstep/sweep.py``): B in {1, 8, 32, 64, 128, max} for dep_q 16 and 8,
  graph == eager, profiles, Mimi, bare real-time ticks.

Every step is timed on the host around the call plus copying its tokens to the host (which waits for the GPU).
Nothing is installed or downloaded; the reference package must be importable (``pip install --no-deps`` of the
carried wheel).

Usage (on the H200, after ``scripts/gpu-wheels.sh`` here and its install line there):
    PYTHONPATH=/tmp/site:. python3 bench/lockstep_gpu.py             # lockstep-against-reference-<gpu>-<commit>.json
    PYTHONPATH=/tmp/site:. python3 bench/lockstep_gpu.py --legacy --ticks 30   # lockstep-sweep-<gpu>-<commit>.json
    python3 bench/lockstep_gpu.py --paged --sections equal cost churn   # lockstep-paged-<gpu>-<commit>.json
(``--out DIR_OR_FILE`` puts them elsewhere, e.g. ``$OUT`` on the device machine, with BENCH_COMMIT set.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lockstep.common import FRAME_MS, GiB, free_memory, log, save  # noqa: E402
from bench.results_io import result_path  # noqa: E402


def summarize(results: dict) -> dict:
    """The issue's targets, each with the measured number it is judged on (full context is the worst case)."""
    out = {}
    for key, entry in results["configs"].items():
        ratios = entry.get("ratio_ours_over_reference", {})
        for B, limit in ((1, 0.5), (64, 0.6)):
            r = ratios.get(B)
            if r:
                out[f"{key}_B{B}_ratio"] = {
                    "limit": limit,
                    **r,
                    "met_fresh": r["fresh"] <= limit,
                    "met_full_context": r["full"] <= limit,
                }
        if "graph_equals_eager" in entry:
            out[f"{key}_greedy_graph_equals_eager_200_frames"] = all(
                v["equal"] for mode in entry["graph_equals_eager"].values() for v in mode.values()
            )
    rt = results.get("realtime", {})
    for name in ("B128_full", "B128_30s"):
        if name in rt:
            out[f"dep_q16_{name}_p99_ms"] = {"p99": rt[name]["p99"], "limit": FRAME_MS, "met": rt[name]["realtime"]}
    return out


def copy_bandwidth() -> float:
    x = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    tbps = round(2 * 10 * 2 * GiB / (time.perf_counter() - t) / 1e12, 2)
    del x, y
    return tbps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="a file, or a directory for the named result")
    p.add_argument("--legacy", action="store_true", help="issue 5's sweep instead of issue 13's sections")
    p.add_argument("--paged", action="store_true", help="issue 13's goal 4: paged KV (no reference needed)")
    p.add_argument("--page", type=int, default=128, help="paged: frames per KV page")
    p.add_argument("--slots", type=int, default=320, help="paged: slots (and the largest graph bucket)")
    p.add_argument(
        "--sections",
        nargs="+",
        default=["ref", "serving", "kv", "equal", "capacity"],
        help="against the reference: ref, serving, kv, kvfloor, equal, capacity; paged: equal, cost, churn",
    )
    p.add_argument("--dep-q", type=int, nargs="+", default=[16, 8])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--ticks", type=int, default=60)
    p.add_argument("--ticks-b1", type=int, default=100)
    p.add_argument("--check-frames", type=int, default=200)
    p.add_argument("--max-slots", type=int, default=192)
    p.add_argument("--reserve-gib", type=float, default=7.0)
    p.add_argument("--ref-start", type=int, default=68)
    p.add_argument("--ref-step", type=int, default=4)
    p.add_argument("--ref-limit", type=int, default=200)
    p.add_argument("--kv-frames", type=int, default=500)
    p.add_argument("--sessions", type=int, default=128)
    p.add_argument("--serve-ticks", type=int, default=600)
    p.add_argument("--engine-ticks", type=int, default=200)
    args = p.parse_args()
    what = "lockstep-paged" if args.paged else "lockstep-sweep" if args.legacy else "lockstep-against-reference"
    args.out = result_path(what, gpu=True, out=args.out)  # one file, rewritten after every section
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {
        "command": "PYTHONPATH=/tmp/site:. python3 " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "method": "host time around step + tokens .cpu() (waits for the GPU), median / p99 over the ticks",
    }
    try:
        import triton

        results["triton"] = triton.__version__
    except ImportError:
        results["triton"] = None
    results["copy_TBps_read_plus_write"] = copy_bandwidth()
    if args.paged:
        from bench.lockstep.paged import run_paged

        run_paged(args, results)
    elif args.legacy:
        from bench.lockstep.sweep import run_config

        results["configs"] = {}
        for dep_q in args.dep_q:
            try:
                run_config(dep_q, args, results)
            except Exception:  # keep the other configuration's numbers; the traceback goes into the results
                results["configs"].setdefault(f"dep_q{dep_q}", {})["error"] = traceback.format_exc()
                log(traceback.format_exc())
                free_memory()
            save(results, args.out)
        results["targets"] = summarize(results)
    else:
        from bench.lockstep.against_reference import run_against_reference

        run_against_reference(args, results)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save(results, args.out)
    log(json.dumps({k: v for k, v in results.items() if k not in ("configs", "kv_format_7b")}, default=str)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
