"""The decode attention at the call mix's context lengths: two or more versions of the kernels side by side.

In serving, the temporal transformer's attention reads every live call's fp8 KV once per layer per tick, and at
the mix's age that read is most of the LM's time (bench/notes/serving-e2e.md: 38 ms of a 66 ms tick at ~130 calls
on the H200). Start-up tuning picks each bucket's launch on full 3000-frame windows; the calls in progress are
shorter and their lengths spread. This times one layer of the PersonaPlex shape (32 heads of 128, pages of 128
frames scattered over the pool, fp8 with per-vector scales) for R rows whose lengths are drawn as calls found in
progress in the 3-minute mix (``CallMix.in_progress``; ``--full`` adds full windows), for every candidate launch,
each kernels module in turn for each launch (so both meet the same card state), median of ``--repeats``.
``--tiny`` runs a small shape on the CPU under ``TRITON_INTERPRET=1``, to try the script here.

Reported per rows x lengths x module: the launch tuning picks at full context and its time on these lengths
(what serving runs), the best launch on these lengths, the ring bytes per second, the LM's attention per tick
(x 32 layers), and each module's ratio to the first. Outputs are checked against the first module's.

    python3 bench/lockstep/attention_mix.py --kernels before=/path/to/triton_kernels.py --rows 64,130,229
    TRITON_INTERPRET=1 .venv/bin/python bench/lockstep/attention_mix.py --tiny --rows 3 --repeats 1
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.lockstep.common import log  # noqa: E402
from bench.results_io import write_result  # noqa: E402
from inference.checkpoints.capacity import CallMix  # noqa: E402
from inference.models.moshi.config import LMConfig  # noqa: E402
from inference.models.moshi.fast import ops  # noqa: E402
from inference.models.moshi.fast.tuning import candidate_launches  # noqa: E402

PAGE = 128
DEVICE = "cuda"


def load_kernels(name: str, path: str):
    """A kernels module from a file, under its own name (two versions of the same file side by side)."""
    spec = importlib.util.spec_from_file_location(f"attention_mix_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_for(lengths: list[int], heads: int, head_dim: int, window: int, seed: int) -> ops.KVLayer:
    """One layer's fp8 pool holding ``lengths[r]`` positions for row r, its pages scattered over the pool."""
    per_slot = -(-window // PAGE)
    need = [-(-n // PAGE) for n in lengths]
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    num_pages = 1 + sum(need)
    shape = (num_pages, heads, PAGE, head_dim)
    # e4m3 has no infinity: a value past 448 would be stored as NaN, so the draw stays inside the range
    keys = (torch.randn(shape, device=DEVICE, generator=g).clamp(-4, 4) * 100).to(ops.FP8_DTYPE)
    values = (torch.randn(shape, device=DEVICE, generator=g).clamp(-4, 4) * 100).to(ops.FP8_DTYPE)
    key_scales = torch.rand(shape[:3], device=DEVICE, generator=g) * 0.02 + 0.001
    value_scales = torch.rand(shape[:3], device=DEVICE, generator=g) * 0.02 + 0.001
    order = (torch.randperm(num_pages - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    table = torch.zeros((len(lengths), per_slot), dtype=torch.long)
    at = 0
    for row, pages in enumerate(need):
        table[row, :pages] = torch.tensor(order[at : at + pages])
        at += pages
    windows = torch.full((len(lengths),), window, dtype=torch.long)
    return ops.KVLayer(keys, values, key_scales, value_scales, table.to(DEVICE), windows.to(DEVICE), window)


def time_launch(kernels, q, layer, slots, lengths, launch: ops.AttentionLaunch, repeats: int) -> float | None:
    args = (q, layer, slots, lengths, launch.splits, launch.block_n, launch.warps, launch.stages)
    try:
        kernels.decode_attention(*args)  # compile
    except Exception as exc:  # noqa: BLE001 - a launch the compiler rejects is skipped, as tuning does
        log(f"  launch {launch} rejected: {type(exc).__name__}")
        return None
    times = []
    for _ in range(repeats):
        if DEVICE == "cpu":  # the interpreter: wall clock (a dry run of the script, not a measurement)
            began = time.perf_counter()
            kernels.decode_attention(*args)
            times.append((time.perf_counter() - began) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kernels.decode_attention(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_TBps(gib: float = 4.0, repeats: int = 10) -> float:
    """The card's device-to-device copy rate (bytes read + written per second): the ceiling the ring read is
    compared with, as in bench/notes/lockstep-gpu.md."""
    src = torch.empty(int(gib * 2**30), device=DEVICE, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * src.numel() / (statistics.median(times) * 1e-3) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kernels", action="append", default=[], help="name=path of a triton_kernels.py (first: baseline)"
    )
    parser.add_argument("--rows", default="64,130,229")
    parser.add_argument("--full", action="store_true", help="also full windows (what start-up tuning times)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--what", default="lockstep-attention-mix")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--tiny", action="store_true", help="a small shape on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    global DEVICE, PAGE
    if args.tiny:
        DEVICE, PAGE = "cpu", 8
    modules = [(name, load_kernels(name, path)) for name, path in (k.split("=", 1) for k in args.kernels)]
    modules.append(("checkout", load_kernels("checkout", str(ROOT / "inference/models/moshi/fast/triton_kernels.py"))))
    config = LMConfig(dim=32, num_heads=2, context=41) if args.tiny else LMConfig()
    heads, head_dim, window = config.num_heads, config.dim // config.num_heads, config.kv_window
    result = {
        "bench": "attention_mix",
        "modules": [n for n, _ in modules],
        "shape": {"heads": heads, "head_dim": head_dim, "window": window, "page": PAGE, "layers": config.num_layers},
        "runs": [],
    }
    if DEVICE == "cuda":
        result["copy_TBps"] = round(copy_TBps(), 2)
        log(f"device-to-device copy: {result['copy_TBps']} TB/s (read + write)")
    for rows in (int(r) for r in args.rows.split(",")):
        mix = CallMix(seed=rows)
        cases = [("mix", [max(1, min(mix.in_progress()[0], window)) for _ in range(rows)])]
        if args.full:
            cases.append(("full", [window] * rows))
        for label, lengths in cases:
            layer = layer_for(lengths, heads, head_dim, window, seed=rows)
            slots = torch.arange(rows, device=DEVICE)
            lens = torch.tensor(lengths, device=DEVICE)
            q = torch.randn(rows, heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
            ring_bytes = sum(lengths) * heads * (2 * head_dim + 8)
            launches = candidate_launches(rows, heads, PAGE)
            times = {name: {} for name, _ in modules}
            for launch in launches:  # every module on one launch before the next launch: the same card state
                for name, kernels in modules:
                    times[name][launch] = time_launch(kernels, q, layer, slots, lens, launch, args.repeats)
            full_layer = layer_for([window] * rows, heads, head_dim, window, seed=rows + 1) if label == "mix" else layer
            full_lens = torch.full((rows,), window, device=DEVICE)
            reference = None
            run = {
                "rows": rows,
                "lengths": label,
                "mean_positions": round(sum(lengths) / rows, 1),
                "ring_GB": round(ring_bytes / 1e9, 3),
                "modules": {},
            }
            for name, kernels in modules:
                timed = {k: v for k, v in times[name].items() if v is not None}
                best = min(timed, key=timed.get)
                # the launch start-up tuning would choose: the fastest on full windows (timed once more here)
                tuned = min(
                    timed, key=lambda la, k=kernels: time_launch(k, q, full_layer, slots, full_lens, la, 5) or 1e9
                )
                out = kernels.decode_attention(
                    q, layer, slots, lens, best.splits, best.block_n, best.warps, best.stages
                )
                if reference is None:
                    reference, error = out.float(), 0.0
                else:
                    error = float((out.float() - reference).norm() / reference.norm())
                run["modules"][name] = {
                    "best_launch": dataclasses.asdict(best),
                    "best_ms": round(timed[best], 4),
                    "best_TBps": round(ring_bytes / (timed[best] * 1e-3) / 1e12, 2),
                    "tuned_launch": dataclasses.asdict(tuned),
                    "tuned_ms": round(timed[tuned], 4),
                    "tuned_TBps": round(ring_bytes / (timed[tuned] * 1e-3) / 1e12, 2),
                    "lm_attention_ms_per_tick_tuned": round(timed[tuned] * config.num_layers, 2),
                    "rel_error_vs_first": error,
                }
            first = run["modules"][modules[0][0]]
            for name, m in run["modules"].items():
                m["tuned_ratio_to_first"] = round(m["tuned_ms"] / first["tuned_ms"], 3)
                m["best_ratio_to_first"] = round(m["best_ms"] / first["best_ms"], 3)
                log(
                    f"rows {rows} {label} (mean {run['mean_positions']} positions, {run['ring_GB']} GB): {name}: "
                    f"tuned {m['tuned_launch']} {m['tuned_ms']} ms {m['tuned_TBps']} TB/s (x{m['tuned_ratio_to_first']}), "
                    f"best {m['best_launch']} {m['best_ms']} ms {m['best_TBps']} TB/s (x{m['best_ratio_to_first']}), "
                    f"err {m['rel_error_vs_first']:.2e}"
                )
            result["runs"].append(run)
            layer = full_layer = None  # the pools go before the next case is allocated
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    result["device"] = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreted: not a measurement)"
    log(f"wrote {write_result(result, args.what, gpu=True, out=args.out)}")


if __name__ == "__main__":
    main()
